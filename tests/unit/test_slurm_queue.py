"""Slurm's jobs in `jobs`, `logs` and `stop`, on a local host with stand-in squeue,
scontrol and scancel on PATH: the queue parsed, a Slurm job named slurm-ID, its output
so far, a cancel waited out, and each failure one line with the fix."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpucluster import slurm_states
from gpucluster.errors import GpuclusterError
from gpucluster.inventory import load
from gpucluster.remote.session import Session
from gpucluster.remote.ssh import SshOptions
from gpucluster.slurm import queue
from tests.cli import gpucluster
from tests.stand_ins import stand_in


@pytest.fixture
def session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Session:
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    inventory = tmp_path / "c.yaml"
    inventory.write_text("hosts:\n  - {name: a, address: 127.0.0.1, connection: local}\n")
    return Session(load(inventory), SshOptions(tmp_path / "known_hosts"))


def test_a_slurm_job_is_named_slurm_id_and_never_taken_for_ours() -> None:
    assert queue.slurm_job("slurm-12") == "12" and queue.slurm_job("SLURM-7") == "7"
    for ours in (None, "last", "20261203-032946-d45d", "d45d", "8728"):
        assert queue.slurm_job(ours) is None
    with pytest.raises(GpuclusterError, match=r"^slurm-x: a Slurm job is slurm-ID, ID its "
                                              r"number \(fix: e.g. slurm-12"):
        queue.slurm_job("slurm-x")
    # Job 0 would be every job to scontrol; Slurm's ids start at 1, in ASCII digits.
    for not_a_job in ("slurm-0", "slurm-012", "slurm-\u0661\u0662", "slurm-", "slurm-12_3"):
        with pytest.raises(GpuclusterError, match="gpucluster jobs lists them"):
            queue.slurm_job(not_a_job)


def test_the_queue_is_read_from_squeue_where_slurm_is_set_up(
        session: Session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in(tmp_path / "bin", "squeue", "echo '12|train|gcuser|RUNNING|1:05|2|node[1-2]'\n"
                                 "echo '13|eval x|root|PENDING|0:00|1|(Resources)'\n")
    monkeypatch.setattr(slurm_states, "SET_UP_HERE", "false")
    assert queue.queue(session, session.inventory) is None  # nothing to ask
    monkeypatch.setattr(slurm_states, "SET_UP_HERE", "true")
    jobs = queue.queue(session, session.inventory)
    assert jobs == [queue.QueuedJob("12", "train", "gcuser", "RUNNING", "1:05", 2, "node[1-2]"),
                    queue.QueuedJob("13", "eval x", "root", "PENDING", "0:00", 1,
                                    "(Resources)")]
    stand_in(tmp_path / "bin", "squeue", "echo 'slurm_load_jobs error: Unable to contact slurm "
                                 "controller (connect failure)' >&2; exit 1\n")
    with pytest.raises(GpuclusterError, match=r"^a: squeue failed: slurm_load_jobs error: "
                                              r"Unable to contact .* \(fix: is slurmctld "
                                              r"running\? gpucluster provision --with slurm"):
        queue.queue(session, session.inventory)


def test_jobs_lists_the_ended_slurm_jobs_slurm_keeps_after_its_queue(
        session: Session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job that had just failed vanished from `jobs` (squeue lists the queue alone): now
    squeue -t all, the queue first, and each that failed by itself named under it."""
    import io

    from rich.console import Console

    from gpucluster.cli.slurm_jobs import print_queue

    stand_in(tmp_path / "bin", "squeue", 'case "$*" in *"-t all"*) ;; *) exit 0;; esac\n'
                                 "echo '11|fails|root|FAILED|0:03|1|(NonZeroExitCode)'\n"
                                 "echo '12|train|gcuser|RUNNING|1:05|2|node[1-2]'\n"
                                 "echo '10|asked|root|CANCELLED|0:09|1|node3'\n"
                                 "echo '9|done|root|COMPLETED|0:41|2|node[1-2]'\n")
    monkeypatch.setattr(slurm_states, "SET_UP_HERE", "true")
    assert queue.queue(session, session.inventory) == []  # the queue alone: prune, top...
    jobs = queue.queue(session, session.inventory, with_ended=True)
    assert jobs is not None
    assert [(j.id, j.ended) for j in jobs] == [("11", True), ("12", False), ("10", True),
                                               ("9", True)]
    out = io.StringIO()
    print_queue(Console(file=out, width=120), jobs)
    rows = [line.split("│")[1].strip() for line in out.getvalue().splitlines()
            if line.startswith("│")]
    assert rows == ["slurm-12", "slurm-11", "slurm-10", "slurm-9"]
    assert out.getvalue().splitlines()[-1] == \
        "slurm-11 failed (NonZeroExitCode): gpucluster logs slurm-11 shows its output"
    assert "slurm-10 cancelled:" not in out.getvalue()  # a cancel is asked for


def test_set_up_from_here_needs_the_inventory_or_provisions_munge_key(tmp_path: Path) -> None:
    inventory = tmp_path / "c.yaml"
    inventory.write_text("hosts:\n  - {name: a, address: 10.0.0.1}\n")
    state = tmp_path / ".gpucluster"
    assert not queue.set_up_from_here(load(inventory))
    inventory.write_text("hosts:\n  - {name: a, address: 10.0.0.1}\nslurm:\n  enabled: false\n")
    assert not queue.set_up_from_here(load(inventory))  # a sandbox's, until provision
    (state / "slurm").mkdir(parents=True)
    (state / "slurm" / "munge.key").write_bytes(b"k")
    assert queue.set_up_from_here(load(inventory))


def test_cancel_waits_for_slurm_to_end_the_job(session: Session, tmp_path: Path) -> None:
    """RUNNING before scancel, COMPLETING at the first look after, then CANCELLED."""
    calls = tmp_path / "calls"
    stand_in(tmp_path / "bin", "scancel", f"echo \"$@\" > {tmp_path}/cancelled\n")
    stand_in(tmp_path / "bin", "scontrol", f"echo x >> {calls}; n=$(wc -l < {calls})\n"
                                   f"case $n in 1) state=RUNNING;; 2) state=COMPLETING;; "
                                   f"*) state=CANCELLED;; esac\n"
                                   f"echo \"JobId=12 JobState=$state ExitCode=0:15 "
                                   f"BatchHost=a\"\n")
    info, already = queue.cancel(session, session.inventory, "12")
    assert (tmp_path / "cancelled").read_text().strip() == "12"
    assert (info.state, info.exit_code, info.ended, already) == ("CANCELLED", "0:15", True,
                                                                 False)
    # Once ended, nothing is cancelled, and that is said.
    (tmp_path / "cancelled").unlink()
    info, already = queue.cancel(session, session.inventory, "12")
    assert already and info.state == "CANCELLED" and not (tmp_path / "cancelled").exists()
    # A job Slurm does not know, and a scancel that fails, are one line each.
    stand_in(tmp_path / "bin", "scontrol", "echo 'slurm_load_jobs error: Invalid job id specified' "
                                   ">&2; exit 1\n")
    with pytest.raises(GpuclusterError, match=r"^Slurm does not know job 12: .* \(fix: "
                                              r"gpucluster jobs lists Slurm's queue\)$"):
        queue.cancel(session, session.inventory, "12")
    stand_in(tmp_path / "bin", "scontrol", "echo 'JobId=12 JobState=RUNNING BatchHost=a'\n")
    stand_in(tmp_path / "bin", "scancel", "echo 'scancel: error: Kill job error on job id 12: "
                                  "Access/permission denied' >&2; exit 1\n")
    with pytest.raises(GpuclusterError, match=r"^a: scancel 12 failed: scancel: error: Kill "
                                              r"job error on job id 12: Access/permission"):
        queue.cancel(session, session.inventory, "12")


def test_logs_without_follow_shows_the_output_so_far_and_returns(
        session: Session, tmp_path: Path) -> None:
    from gpucluster.slurm.follow import follow

    out = tmp_path / "slurm-9.out"
    out.write_text("epoch 1\n")
    stand_in(tmp_path / "bin", "scontrol", f"echo 'JobId=9 JobState=RUNNING BatchHost=a "
                                   f"StdOut={out} ExitCode=0:0 NodeList=a Reason=None'\n")
    shown: list[str] = []
    info = follow(session, session.inventory, "9", shown.append, live=False)
    assert "".join(shown) == "epoch 1\n" and info.state == "RUNNING" and not info.ended
    # -n: from the start of its last lines (a last line without its newline is one)
    out.write_text("epoch 1\nepoch 2\nepoch 3\nepo")
    for lines, expected in ((2, "epoch 3\nepo"), (9, "epoch 1\nepoch 2\nepoch 3\nepo"),
                            (0, "")):
        shown.clear()
        follow(session, session.inventory, "9", shown.append, live=False, tail=lines)
        assert "".join(shown) == expected, (lines, shown)


def test_a_slurm_jobs_lines_have_no_time_to_search_by(tmp_path: Path) -> None:
    inventory = tmp_path / "c.yaml"
    inventory.write_text("hosts:\n  - {name: a, address: 10.0.0.1}\n")
    done = gpucluster("logs", "-i", str(inventory), "slurm-4", "--since", "10m")
    assert done.code == 2 and done.stderr.strip() == (
        "gpucluster: error: slurm-4: a Slurm job's lines carry no time of their own: "
        "--since, --until, --all-jobs and --json do not apply (fix: -w, --rank or --grep, "
        "or gpucluster logs slurm-4 | grep ...)")


def test_a_slurm_jobs_lines_are_searched_by_node_rank_and_text(
        session: Session, tmp_path: Path) -> None:
    """As a launched job's: -w, --rank and --grep keep lines, -n the last of those kept;
    a line without a label (the batch script's) is no node's or rank's: --grep alone.
    Followed (-f), the same lines are kept as they come, -n then the file's last lines."""
    out = tmp_path / "slurm-9.out"
    out.write_text("0: gpucluster: a is task 0\n1: gpucluster: b is task 1\n"
                   "0: [0]:epoch 1 loss 0.5\n1: [1]:epoch 1 loss 0.6\n"
                   "gpucluster: Slurm job 9 requeued: start 2, on a,b\n"
                   "1: W1206 06:29:36.558000 15 api.py:1028] Sending process 7 signal\n"
                   "0: [0]:epoch 2 loss 0.4\n1: [1]:epoch 2 loss 0.3\n")
    stand_in(tmp_path / "bin", "scontrol", f"echo 'JobId=9 JobState=COMPLETED BatchHost=a "
                                   f"StdOut={out} ExitCode=0:0 NodeList=a,b Reason=None'\n")
    inventory = str(tmp_path / "c.yaml")
    path = {"PATH": os.environ["PATH"]}  # the stand-ins first

    def search(*options: str) -> list[str]:
        done = gpucluster("logs", "-i", inventory, "slurm-9", *options, env=path)
        assert done.code == 0, done.stderr
        return done.stdout.splitlines()

    assert search("--rank", "1") == ["[b/1] epoch 1 loss 0.6", "[b/1] epoch 2 loss 0.3"]
    assert search("-w", "b") == ["[b/1] epoch 1 loss 0.6",
                                 "[b] W1206 06:29:36.558000 15 api.py:1028] Sending process 7 "
                                 "signal", "[b/1] epoch 2 loss 0.3"]
    assert search("--grep", "epoch 2|requeued") == [
        "gpucluster: Slurm job 9 requeued: start 2, on a,b", "[a/0] epoch 2 loss 0.4",
        "[b/1] epoch 2 loss 0.3"]
    assert search("--grep", "loss", "-n", "3") == [
        "[b/1] epoch 1 loss 0.6", "[a/0] epoch 2 loss 0.4", "[b/1] epoch 2 loss 0.3"]
    assert search("-w", "b", "--grep", "requeued") == []
    for kept in (["--rank", "1"], ["-w", "b"], ["--grep", "epoch 2|requeued"]):
        assert search("-f", *kept) == search(*kept), kept
    assert search("-f", "--grep", "loss", "-n", "3") == [
        "[a/0] epoch 2 loss 0.4", "[b/1] epoch 2 loss 0.3"]
    # -n: the file's end, its tasks named by their word before it
    assert search("-n", "2") == ["[a/0] epoch 2 loss 0.4", "[b/1] epoch 2 loss 0.3"]
    nothing = gpucluster("logs", "-i", inventory, "slurm-9", "--rank", "5", env=path)
    assert nothing.code == 0 and nothing.stderr.splitlines() == [
        "no line of Slurm job 9 matches", "Slurm job 9 completed"], nothing.stderr


def test_logs_of_a_slurm_job_through_the_cli(session: Session, tmp_path: Path) -> None:
    """As `logs JOB`: what is there and how it ended, exit 0; a job Slurm does not know
    is one line, exit 2."""
    out = tmp_path / "slurm-9.out"
    out.write_text("epoch 1\nTraceback: boom\n")
    stand_in(tmp_path / "bin", "scontrol", f"[ \"$4\" = 9 ] || {{ echo 'slurm_load_jobs error: "
                                   f"Invalid job id specified' >&2; exit 1; }}\n"
                                   f"echo 'JobId=9 JobState=FAILED BatchHost=a "
                                   f"StdOut={out} ExitCode=1:0 NodeList=a Reason=None'\n")
    inventory = str(tmp_path / "c.yaml")
    path = {"PATH": os.environ["PATH"]}  # the stand-ins first
    shown = gpucluster("logs", "-i", inventory, "slurm-9", env=path)
    assert (shown.code, shown.stdout) == (0, "epoch 1\nTraceback: boom\n"), shown.stderr
    assert shown.stderr.strip() == "Slurm job 9 failed (exit 1:0)"
    followed = gpucluster("logs", "-i", inventory, "-f", "slurm-9", env=path)
    assert followed.code == 1 and followed.stdout == shown.stdout  # -f: the job's verdict
    # A job of export sbatch's: the first failure and its likely cause, as launch names them.
    out.write_bytes((Path(__file__).parents[1] / "fixtures/slurm/died-in-a-bar-2-nodes.out"
                     ).read_bytes())
    failed = gpucluster("logs", "-i", inventory, "slurm-9", env=path)
    assert failed.code == 0 and failed.stderr.splitlines()[:3] == [
        "Slurm job 9 failed (exit 1:0)",
        "first failure: rank 1 on node1, worker exit code 1",
        "likely cause: the GPU ran out of memory (fix: lower the batch size per GPU, or use "
        "gradient accumulation or activation checkpointing; with much memory reserved but "
        "unallocated, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; `gpucluster top` "
        "shows any other process holding memory on that GPU, `gpucluster reap` ends "
        "leftovers)"], failed.stderr
    unknown = gpucluster("logs", "-i", inventory, "slurm-10", env=path)
    assert unknown.code == 2 and unknown.stderr.strip() == (
        "gpucluster: error: Slurm does not know job 10: it forgets an ended job after "
        "MinJobAge, 300 s by default (its output stays in slurm-10.out where it was "
        "submitted)")


def test_a_file_is_read_byte_for_byte_and_a_missing_one_says_so(
        session: Session, tmp_path: Path) -> None:
    from gpucluster.slurm.follow import file_bytes

    host = session.inventory.hosts[0]
    data = bytes(range(256)) * 4  # not text: every byte value
    (tmp_path / "out").write_bytes(data)
    assert file_bytes(session, host, str(tmp_path / "out"), "100") == data[-100:]
    assert file_bytes(session, host, str(tmp_path / "out"), "+1001", 10) == data[1000:1010]
    with pytest.raises(GpuclusterError, match=r"^a: .*/gone cannot be read$"):
        file_bytes(session, host, str(tmp_path / "gone"), "100")


class _NoNodes:
    def __init__(self) -> None:
        self.interval_s, self.nodes = 1.0, {}
        self.inventory = SimpleNamespace(hosts=[])


def test_the_exporter_serves_slurms_queue_and_drops_it_when_squeue_stops_answering(
        session: Session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses
    import time

    from prometheus_client import CollectorRegistry, generate_latest

    from gpucluster.observe.exporter import ClusterCollector
    from gpucluster.observe.slurm_queue import FRESH_S, QueuePoller

    stand_in(tmp_path / "bin", "squeue", "echo '12|train|gcuser|RUNNING|1:05|2|node[1-2]'\n"
                                 "echo '13|eval|root|PENDING|0:00|1|(Resources)'\n"
                                 "echo '14|eval|root|PENDING|0:00|3|(Priority)'\n")
    monkeypatch.setattr(slurm_states, "SET_UP_HERE", "true")
    poller = QueuePoller(session, session.inventory)

    def scrape() -> str:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(ClusterCollector(_NoNodes(), poller))  # type: ignore[arg-type]
        return generate_latest(registry).decode()

    assert "gpucluster_slurm_up 0.0" in scrape()  # no answer yet
    assert "gpucluster_slurm_jobs" not in scrape()
    poller.latest = answered = poller.read()
    text = scrape()
    assert "gpucluster_slurm_up 1.0" in text
    assert 'gpucluster_slurm_jobs{state="PENDING"} 2.0' in text
    assert 'gpucluster_slurm_jobs{state="RUNNING"} 1.0' in text
    assert ('gpucluster_slurm_job_nodes{name="train",slurm_job_id="12",state="RUNNING",'
            'user="gcuser"} 2.0') in text
    # An answer too old, or squeue failing: no queue figures rather than stale ones.
    poller.latest = dataclasses.replace(answered, at=answered.at - FRESH_S - 1)
    assert "gpucluster_slurm_up 0.0" in scrape() and "gpucluster_slurm_jobs{" not in scrape()
    stand_in(tmp_path / "bin", "squeue", "echo 'slurm_load_jobs error: Unable to contact slurm "
                                 "controller (connect failure)' >&2; exit 1\n")
    poller.latest = poller.read()
    assert "Unable to contact slurm controller" in poller.latest.error
    assert "gpucluster_slurm_up 0.0" in scrape()
    # Its thread reads the queue until closed; an empty queue still has both states.
    stand_in(tmp_path / "bin", "squeue", "true\n")
    with QueuePoller(session, session.inventory, every_s=0.05) as polling:
        deadline = time.monotonic() + 10
        while polling.latest is None or polling.latest.error:
            assert time.monotonic() < deadline, polling.latest
            time.sleep(0.05)
        poller = polling
        assert 'gpucluster_slurm_jobs{state="RUNNING"} 0.0' in scrape()
    # The controller host has no Slurm after all: no Slurm series at all.
    monkeypatch.setattr(slurm_states, "SET_UP_HERE", "false")
    poller.latest = poller.read()
    assert "gpucluster_slurm" not in scrape()


def test_top_sums_up_slurms_queue_or_says_why_it_cannot() -> None:
    from gpucluster.cli.views.top import summary_line
    from gpucluster.observe.slurm_queue import QueueReading
    from gpucluster.observe.snapshot import Snapshot, to_json

    jobs = (queue.QueuedJob("12", "train", "gcuser", "RUNNING", "1:05", 2, "node[1-2]"),
            queue.QueuedJob("13", "eval", "root", "PENDING", "0:00", 1, "(Resources)"),
            queue.QueuedJob("14", "eval", "root", "PENDING", "0:00", 3, "(Priority)"),
            queue.QueuedJob("9", "old", "root", "COMPLETING", "3:00", 1, "node3"))
    answered = Snapshot(0.0, 1.0, (), QueueReading(jobs, "", 0.0))
    assert "Slurm: 1 running, 1 completing, 2 pending" in summary_line(answered).plain
    assert to_json(answered)["slurm"] == {
        "up": True, "error": None, "jobs": {"COMPLETING": 1, "PENDING": 2, "RUNNING": 1}}
    silent = Snapshot(0.0, 1.0, (), QueueReading((), "node1: squeue failed: x", 0.0))
    assert "Slurm: node1: squeue failed: x" in summary_line(silent).plain
    assert to_json(silent)["slurm"] == {"up": False, "error": "node1: squeue failed: x",
                                        "jobs": None}
    # Where Slurm is not set up from here: not a word about it, and null.
    assert "Slurm" not in summary_line(Snapshot(0.0, 1.0, ())).plain
    assert to_json(Snapshot(0.0, 1.0, ()))["slurm"] is None


def test_top_job_slurm_id_picks_the_nodes_slurm_runs_it_on(session: Session,
                                                           tmp_path: Path) -> None:
    from gpucluster.slurm.follow import running_nodes

    stand_in(tmp_path / "bin", "scontrol", "echo 'JobId=12 JobState=RUNNING BatchHost=a "
                                   "ExitCode=0:0 NodeList=a,b[1-2] Reason=None'\n")
    assert running_nodes(session, "12", "fix it") == ["a", "b1", "b2"]
    stand_in(tmp_path / "bin", "scontrol", "echo 'JobId=12 JobState=PENDING BatchHost= "
                                   "ExitCode=0:0 NodeList= Reason=Resources'\n")
    with pytest.raises(GpuclusterError, match=r"^Slurm job 12 is pending \(Resources\): "
                                              r"it runs on no node now \(fix: fix it\)"):
        running_nodes(session, "12", "fix it")
    # Through the CLI: a job on none of the inventory's nodes is one line.
    stand_in(tmp_path / "bin", "scontrol", "echo 'JobId=12 JobState=RUNNING BatchHost=b "
                                   "ExitCode=0:0 NodeList=b Reason=None'\n")
    done = gpucluster("top", "-i", str(session.inventory.path), "--once", "-j", "slurm-12")
    assert done.code == 2 and done.stderr.strip() == (
        f"gpucluster: error: Slurm job 12 runs on b, none of them in "
        f"{session.inventory.path} now (fix: gpucluster top without --job, or -w with the "
        f"job's nodes)"), done.stderr
