"""Launch without a network: what the sync sends and deletes, the job store, the node
scripts (valid shell), torchrun's command line, and reading torchrun's failure report."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import shutil
import signal
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucluster import inventory as inventory_module
from gpucluster.errors import GpuclusterError
from gpucluster.launch import node_scripts, workdir
from gpucluster.launch.failure import failure_of, in_a_line
from gpucluster.launch.jobs import JOB_ID, JobRecord, JobStore, new_job_id
from gpucluster.launch.model import (
    FirstFailure,
    JobOutcome,
    LaunchRequest,
    NodeState,
    parse_state,
)
from gpucluster.launch.request import check_request
from gpucluster.launch.start import large_files_note, sync_summary
from gpucluster.nproc import GpuCount, check_fit, check_nproc
from gpucluster.remote.session import Session
from gpucluster.torchrun import TorchrunSpec, command_line, torchrun_argv
from tests.cli import gpucluster
from tests.local_job import (
    LOGGING_TORCHRUN_STAND_IN,
    job_record,
    local_job,
    wait_for,
)
from tests.stand_ins import stand_in


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_local_files_leave_out_vcs_virtualenvs_caches_state_and_ignored(tmp_path: Path) -> None:
    _tree(tmp_path, {
        "train.py": "x", "pkg/model.py": "y", "pkg/__pycache__/model.pyc": "c",
        ".git/HEAD": "ref", ".gpucluster/gpucluster_ed25519": "KEY",
        "myenv/pyvenv.cfg": "home", "myenv/lib/site.py": "s",
        "data/big.ckpt": "weights", "outputs/run1/log.txt": "l", "notes/outputs": "file",
        "sub/outputs/x": "nested", "docs/readme.md": "d",
        ".gpuclusterignore": "# comment\n\n*.ckpt\noutputs/\n/docs/*.md\n",
        # `bundle` writes its archives here by default: a bug report, not the job's code
        "gpucluster-bundle-20261202-112538.tar.gz": "z",
        "gpucluster-bundle-20261202-112600.tar.gz.partial": "z",
    })
    files = workdir.local_files(tmp_path)
    assert sorted(files) == [".gpuclusterignore", "notes/outputs", "pkg/model.py", "train.py"]
    assert files["train.py"].size == 1
    assert files["train.py"].mtime == int((tmp_path / "train.py").stat().st_mtime)


def test_the_ignore_file_follows_gits_rules(tmp_path: Path) -> None:
    _tree(tmp_path, {
        "a.log": "x", "keep.log": "k", "logs/keep.log": "k2", "data/x/raw/1.bin": "r",
        "data/raw.txt": "t", "src/model.py": "m", "build/keep.log": "b",
        ".gpuclusterignore": "*.log\n!keep.log\ndata/**/raw/\nbuild/\n",
    })
    # A negated pattern brings a file back, unless a directory above it is excluded.
    assert sorted(workdir.local_files(tmp_path)) == [
        ".gpuclusterignore", "data/raw.txt", "keep.log", "logs/keep.log", "src/model.py"]


def test_an_invalid_ignore_pattern_names_its_line(tmp_path: Path) -> None:
    (tmp_path / ".gpuclusterignore").write_text("*.log\n!\n")
    with pytest.raises(GpuclusterError, match=r"\.gpuclusterignore:2: '!' is not a valid "
                                              r"gitignore pattern"):
        workdir.local_files(tmp_path)


def test_plan_sends_changed_and_deletes_only_what_it_sent(tmp_path: Path) -> None:
    _tree(tmp_path, {"a.py": "aa", "b.py": "bbb", "c.py": "new"})
    local = workdir.local_files(tmp_path)
    a, b = local["a.py"], local["b.py"]
    remote = {"a.py": (a.size, a.mtime), "b.py": (b.size, b.mtime - 5), "old.py": (1, 1),
              "checkpoint.pt": (9, 9)}
    plan = workdir.plan_sync(local, {"a.py", "b.py", "old.py", "gone.py"}, remote)
    assert [f.path for f in plan.send] == ["b.py", "c.py"]
    assert plan.delete == ("old.py",)  # never checkpoint.pt: the job wrote it
    assert plan.unchanged == 1
    # Sent before and ignored now (a dataset the nodes keep): not deleted there.
    (tmp_path / ".gpuclusterignore").write_text("old.py\n")
    kept = workdir.plan_sync(local, {"a.py", "old.py"}, remote,
                             workdir.IgnoreRules(tmp_path).ignored)
    assert kept.delete == ()


def test_listing_round_trip_keeps_odd_names() -> None:
    output = ("@@gpc section manifest\na.py\ndir/b c.py\n\n@@gpc end 0\n"
              "@@gpc section files\n12 1700000000.5 a.py\n"
              "3 1700000001.0000000000 dir/b c.py\n@@gpc end 0\n")
    from gpucluster import reports

    previous, remote = workdir.parse_listing(reports.sections(output))
    assert previous == {"a.py", "dir/b c.py"}
    assert remote == {"a.py": (12, 1700000000), "dir/b c.py": (3, 1700000001)}


def test_tar_carries_files_with_their_mtime_and_the_manifest(tmp_path: Path) -> None:
    _tree(tmp_path, {"x/y.py": "print(1)"})
    os.utime(tmp_path / "x/y.py", (1_700_000_000, 1_700_000_000))
    local = workdir.local_files(tmp_path)
    with workdir.tar_stream(tmp_path, tuple(local.values()), sorted(local)) as stream:
        data = stream.read()  # a pipe, written while it is read
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        member = archive.getmember("x/y.py")
        assert member.mtime == 1_700_000_000
        manifest = archive.extractfile(workdir.MANIFEST)
        assert manifest is not None and manifest.read() == b"x/y.py"
    assert "\nset -- 'it'\"'\"'s.py'\n" in workdir.apply_command(
        "/srv/p", ("it's.py",), "n1")


def test_a_name_that_cannot_be_synced_is_a_clear_error_unless_ignored(tmp_path: Path) -> None:
    _tree(tmp_path, {"train.py": "x"})
    (tmp_path / os.fsdecode(b"caf\xe9.txt")).write_text("latin-1 name")
    with pytest.raises(GpuclusterError, match=r"^\S+/caf\\xe9\.txt: a file name that is not "
                                              r"UTF-8 cannot be synced \(fix: rename it, or "
                                              r"list it in \S+/\.gpuclusterignore\)$"):
        workdir.local_files(tmp_path)
    (tmp_path / ".gpuclusterignore").write_text("caf*.txt\n")
    assert sorted(workdir.local_files(tmp_path)) == [".gpuclusterignore", "train.py"]
    (tmp_path / "two\nlines.py").write_text("")
    with pytest.raises(GpuclusterError, match=r"two\\nlines\.py: a file name with a line "
                                              r"break cannot be synced"):
        workdir.local_files(tmp_path)


def test_a_node_refuses_a_sync_cut_short_before_its_manifest(tmp_path: Path) -> None:
    """A tar that ends early at a member's boundary is a valid tar to GNU tar: the
    manifest, always last, is what says the stream is whole."""
    _tree(tmp_path, {"a.py": "x"})
    local = workdir.local_files(tmp_path)
    with workdir.tar_stream(tmp_path, tuple(local.values()), sorted(local)) as stream:
        whole = stream.read()
    cut = whole[:1024]  # a.py's header and data, nothing after
    target = tmp_path / "node"
    target.mkdir()
    applied = subprocess.run(["sh", "-c", workdir.apply_command(str(target), (), "n1")],
                             input=cut, capture_output=True, timeout=30, check=False)
    assert applied.returncode != 0
    assert b"the work dir's tar ended early" in applied.stderr
    assert not (target / "a.py").exists()


def test_a_file_that_vanishes_during_the_sync_is_a_clear_error(tmp_path: Path) -> None:
    _tree(tmp_path, {"a.py": "x", "b.py": "y"})
    local = workdir.local_files(tmp_path)
    (tmp_path / "b.py").unlink()
    with pytest.raises(GpuclusterError, match="cannot read the work dir to sync it"), \
            workdir.tar_stream(tmp_path, tuple(local.values()), sorted(local)) as stream:
        stream.read()
    with pytest.raises(GpuclusterError, match=r"^cannot read the work dir to sync it: .*b\.py"), \
            workdir.tar_streams(tmp_path, {"n1": tuple(local.values())}, sorted(local)):
        pass  # made in memory, before any node is sent anything


def test_a_file_that_vanishes_before_the_shared_tar_is_made_starts_and_stops_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared tar is made before any node is sent anything: its failure was said as
    'did not start everywhere, so it was stopped on every node', and a stop was sent to
    nodes where nothing had started, and the record of a job that never was stayed."""
    from gpucluster.launch import start
    from gpucluster.launch.model import LaunchRequest

    project = tmp_path / "project"
    _tree(project, {"a.py": "x", "b.py": "y"})
    files = workdir.local_files(project)
    (project / "b.py").unlink()
    store = JobStore(tmp_path / "state")
    record = dataclasses.replace(job_record(), hosts=["node1"])
    store.save(record)
    stops: list[str] = []
    monkeypatch.setattr(start, "stop", lambda *args, **kwargs: stops.append("stop"))

    class NoShells:  # the start's shells: never to be sent anything here
        def run(self, *args: object) -> None:
            raise AssertionError("a node was sent the start")

    plan = workdir.SyncPlan(tuple(files.values()), (), 0)
    with pytest.raises(GpuclusterError) as refused:
        start._start_everywhere(
            None, None, store, record, LaunchRequest("a.py", (), project), {},  # type: ignore[arg-type]
            NoShells(), files, {"node1": start._Sync("/c", plan, True)})  # type: ignore[arg-type]
    assert re.fullmatch(r"nothing was started: cannot read the work dir to sync it: .*b\.py.*",
                        str(refused.value)), str(refused.value)
    assert stops == []
    assert not store.directory(record.id).exists()


def test_jobs_started_in_one_second_sort_by_their_start(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    started = []
    for _ in range(40):  # a random last part alone puts the later one first half the time
        started.append(store.new_id(1_800_000_000))
        store.save(JobRecord(started[-1], "train.py", [], ["n1"], "/srv/p", "/srv/jobs",
                             0.0, {"n1": 1}))
        assert store.load(None).id == started[-1]
    assert store.ids() == started
    assert len({i[-4:] for i in started}) == 40
    assert all(JOB_ID.fullmatch(store.new_id(t)) for t in (1_800_000_000, 1_800_000_001))
    # The worst first draw of a second (7fff) leaves room for 128 more, each above the last.
    taken = [f"{started[0][:-4]}7fff"]
    for _ in range(128):
        taken.append(new_job_id(1_800_000_000, taken))
        assert taken[-1] > taken[-2] and JOB_ID.fullmatch(taken[-1]), taken[-2:]
    # A second's ids used up to ffff (another controller's, say): still a well-formed id.
    full = f"{started[0][:-4]}ffff"
    assert JOB_ID.fullmatch(new_job_id(1_800_000_000, [full]))


def test_job_store_finds_jobs_by_id_part_and_newest(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    with pytest.raises(GpuclusterError, match="no jobs recorded"):
        store.load(None)
    ids = [new_job_id(1_800_000_000), new_job_id(1_800_000_100)]
    for job_id in ids:
        store.save(JobRecord(job_id, "train.py", ["--x"], ["n1", "n2"], "/srv/p", "/srv/jobs",
                             0.0, {"n1": 1, "n2": 1}))
    assert store.load(None).id == ids[1]
    assert store.load("last").id == ids[1]  # as bundle, logs, stop... are told it
    assert store.load(ids[0][-4:]).id == ids[0]
    assert store.load(ids[0]).args == ["--x"]
    with pytest.raises(GpuclusterError, match=rf"ambiguous \(2 jobs: {ids[0]}, {ids[1]}\)"):
        store.load(ids[0][:8])  # named, so the next try can pick one
    with pytest.raises(GpuclusterError, match="matches no job"):
        store.load("nope")
    # `stop "$JOB"` with the variable unset: '' is a part of every id, but names no job.
    alone = JobStore(tmp_path / "alone")
    alone.save(store.load(ids[0]))
    for empty in ("", " "):
        with pytest.raises(GpuclusterError, match=rf"^job '{empty}': no job named \(fix: "):
            alone.load(empty)


def test_node_states_from_the_scripts_lines() -> None:
    assert parse_state("n", "exited 0 1800000000.25") == NodeState("n", "exited", 0, "",
                                                                   1800000000.25)
    assert parse_state("n", "stopped -").exit_code is None
    assert parse_state("n", "running -").failed is False
    assert parse_state("n", "exited 1 5").failed and parse_state("n", "lost -").failed


ROOT_CAUSE = """\
[{rank}]:step 10
[{rank}]:terminate called without an active exception
[1]:RuntimeError: Connection closed by peer
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-29_23:28:35
  host      : {node}
  rank      : {other} (local_rank: 1)
  exitcode  : 1 (pid: 11)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : {time}
  host      : {node}
  rank      : {rank} (local_rank: 0)
  exitcode  : {code} (pid: 10)
============================================================
"""


def test_first_failure_is_the_root_cause_not_the_first_to_report(tmp_path: Path) -> None:
    def failure(node: str, rank: int, code: int, time: str, exited_at: float) -> FirstFailure:
        log = tmp_path / f"{node}.log"
        log.write_text(ROOT_CAUSE.format(node=node, rank=rank, other=rank + 1, code=code,
                                         time=time))
        return failure_of(node, NodeState(node, "exited", 1, "", exited_at), log)

    peer = failure("node1", 0, 1, "2026-11-29_23:28:35", 100.1)  # exited first
    killed = failure("node2", 2, -9, "2026-11-29_23:28:35", 100.3)
    assert (killed.rank, killed.worker_exit, killed.exit_code) == (2, -9, 1)
    assert min([peer, killed], key=FirstFailure.order) is killed  # same second: the signal
    earlier = failure("node3", 4, 1, "2026-11-29_23:28:34", 100.9)
    assert min([peer, killed, earlier], key=FirstFailure.order) is earlier
    assert killed.tail[-1].startswith("=====")
    assert killed.rank_tail == ("step 10", "terminate called without an active exception")


def test_a_torchrun_killed_by_sigkill_is_named_as_a_worker_killed_so_is(tmp_path: Path) -> None:
    """`kill -9` of a node's torchrun read `node2: exited 137`, no cause."""
    log = tmp_path / "node2.log"
    log.write_text("[2]:rank 2/4 on node2 ready\n[3]:rank 3/4 on node2 ready\nKilled\n")
    killed = failure_of("node2", NodeState("node2", "exited", 137, "", 100.0), log)
    assert killed.cause is not None and killed.cause.name == "killed"
    assert in_a_line(killed) == ("node2: torchrun was killed by SIGKILL: most often the "
                                 "kernel's out-of-memory killer, for host memory")
    assert "dmesg" in killed.cause.fix
    # Any other code without a worker's report keeps its plain words.
    plain = failure_of("node2", NodeState("node2", "exited", 3, "", 100.0), log)
    assert plain.cause is None and in_a_line(plain) == "node2: exited 3"


@pytest.mark.parametrize("script", ["start", "follow", "stop", "stop-hang", "freeze", "state",
                                    "start-container", "freeze-container",
                                    "stop-hang-container",
                                    "stop-container", "start-peer-stop", "peer-stop",
                                    "watched-peer-stop", "stacks", "stacks-container"])
def test_node_scripts_are_valid_shell(script: str) -> None:
    record = job_record()
    text = {
        "start": lambda: node_scripts.start_script(record, "node-2", "torchrun x", "", False,
                                                   None),
        "start-container": lambda: node_scripts.start_script(record, "node1", "torchrun x",
                                                             "", True, 29500),
        "follow": lambda: node_scripts.follow_script(record, "node-2", True),
        "stop": lambda: node_scripts.stop_script(record, "node-2", 2.5, "/usr/bin/podman"),
        "stop-hang": lambda: node_scripts.stop_script(record, "node-2", 2.5, None,
                                                      dump_stacks=True),
        "freeze": lambda: node_scripts.freeze_script(record, "node-2"),
        "freeze-container": lambda: node_scripts.freeze_script(
            dataclasses.replace(record, image="busybox:latest"), "node-2",
            "sudo:/usr/bin/podman"),
        "stop-hang-container": lambda: node_scripts.stop_script(
            dataclasses.replace(record, image="busybox:latest"), "node-2", 2.5,
            "/usr/bin/podman", dump_stacks=True),
        "stop-container": lambda: node_scripts.stop_script(
            dataclasses.replace(record, image="busybox:latest"), "node-2", 2.5,
            "/usr/bin/docker"),
        "state": lambda: node_scripts.state_script([record], "node-2", record.jobs_dir),
        "stacks": lambda: node_scripts.stacks_script(record, "node-2", None, True, 20),
        "stacks-container": lambda: node_scripts.stacks_script(
            dataclasses.replace(record, image="busybox:latest"), "node-2",
            "sudo:/usr/bin/podman", False, 20),
        "start-peer-stop": lambda: node_scripts.start_script(
            dataclasses.replace(record, image="busybox:latest"), "node1", "torchrun x", "",
            True, 29500, peer_stop=node_scripts.peer_stop(record, "node1", ["node-2"], 5)),
        "peer-stop": lambda: "\n".join(dataclasses.astuple(node_scripts.peer_stop(
            dataclasses.replace(record, image="busybox:latest"), "node1", ["node-2"], 5))),
        "watched-peer-stop": lambda: "\n".join(dataclasses.astuple(node_scripts.peer_stop(
            record, "node1", ["node-2", "node3"], 5, after_s=30))),
    }[script]()
    checked = subprocess.run(["sh", "-n"], input=text, capture_output=True, text=True,
                             check=False)
    assert checked.returncode == 0, checked.stderr
    assert record.id in text


def test_a_started_jobs_leader_carries_its_marker_when_recorded(tmp_path: Path) -> None:
    """The leader is recorded once its execs are done: before, its environ is the start
    script's own, without the marker, and inside each exec (setsid, then sh) it is empty;
    a follow or `jobs` looking then took the job for ended (node3 printed nothing and
    stayed "running" in a CI run). Looked at ten times the moment the pid is known,
    before any round trip could hide the gap: waiting for the marker instead (setsid
    carries it), 3 starts of 60 had a bare look."""
    import shlex

    record = dataclasses.replace(job_record(), jobs_dir=shlex.quote(str(tmp_path / "jobs")),
                                 code_dir=shlex.quote(str(tmp_path)))
    look = ('looked=carries; for _ in 1 2 3 4 5 6 7 8 9 10; do '
            'grep -q -s -z -x -F -e "GPUCLUSTER_JOB=$GPUCLUSTER_JOB" "/proc/$leader/environ" '
            '|| looked=bare; done; echo $looked')
    # A large environment (conda, modules) makes the exec, and so the gap, longer.
    padded = {**os.environ, **{f"GPC_PAD{index}": "x" * 100_000 for index in range(15)}}
    looks, leaders = [], []
    try:
        for index in range(30):  # a node each: start refuses a node that runs a job
            # Long enough to outlast a start on a loaded box: a leader that has ended has
            # an empty environ, and looked 'bare' in a unit run beside a CI run.
            script = node_scripts.start_script(record, f"n{index}", "sleep 60", "", False,
                                               None)
            recorded = 'read -r leader < "$job/leader.pid"\n'
            assert script.count(recorded) == 1
            ran = subprocess.run(["sh", "-c", script.replace(recorded, recorded + look + "\n")],
                                 capture_output=True, text=True, timeout=20, check=True,
                                 env=padded)
            leaders.append(int(ran.stdout.split("@@gpc started ")[1].split()[0]))
            looks.append(ran.stdout.split()[0])
    finally:
        for leader in leaders:  # each leader heads a session (setsid) of its own
            with contextlib.suppress(ProcessLookupError):
                os.killpg(leader, 9)
        for cgroup in (tmp_path / "jobs").glob("*/*/cgroup"):  # made where root runs it
            with contextlib.suppress(OSError):
                for _ in range(50):
                    if not Path(cgroup.read_text().strip(), "cgroup.procs").read_text():
                        break
                    time.sleep(0.05)
                Path(cgroup.read_text().strip()).rmdir()
    assert looks == ["carries"] * 30


@contextlib.contextmanager
def _two_nodes_one_failing(tmp_path: Path, after_s: int = 0
                           ) -> Iterator[tuple[JobRecord, Path, Path]]:
    """node-2 sleeping, node1 exiting 3 after 0.5 s, each with its peer stop armed (after
    `after_s`); an `ssh` on PATH runs the command in a shell of this machine, as the SSH
    mesh would there. Yields the record, the jobs' dir and the `ssh` calls' file."""
    import shlex

    record = dataclasses.replace(job_record(), jobs_dir=shlex.quote(str(tmp_path / "jobs")),
                                 code_dir=shlex.quote(str(tmp_path)))
    bin_dir = tmp_path / "bin"
    stand_in(bin_dir, "ssh", 'for last; do :; done\necho "$@" >> "${0%/*}/calls"\n'
                             'exec sh -c "$last"\n')
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    leaders = []
    try:
        for node, command in (("node-2", "sleep 60"), ("node1", "(sleep 0.5; exit 3)")):
            peers = [n for n in ("node1", "node-2") if n != node]
            script = node_scripts.start_script(
                record, node, command, "", False, None,
                peer_stop=node_scripts.peer_stop(record, node, peers, 1, after_s))
            ran = subprocess.run(["sh", "-c", script], capture_output=True, text=True,
                                 timeout=20, check=True, env=env)
            leaders.append(int(ran.stdout.split("@@gpc started ")[1].split()[0]))
        yield record, tmp_path / "jobs" / record.id, bin_dir / "calls"
    finally:
        for leader in leaders:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(leader, 9)
        for cgroup in (tmp_path / "jobs").glob("*/*/cgroup"):  # made where root runs it
            with contextlib.suppress(OSError):
                Path(cgroup.read_text().strip()).rmdir()


def test_a_detached_node_whose_torchrun_fails_stops_the_job_on_its_peers(
        tmp_path: Path) -> None:
    """launch -d: node1's torchrun fails by itself, so node1 runs node-2's kept stop on
    node-2 over SSH, out of node1's job, before node1's exit code is written; node-2,
    stopped as asked, stops no one in turn."""
    with _two_nodes_one_failing(tmp_path) as (record, jobs, calls_file):
        report = jobs / "node1" / "stop-peers.log"
        wait_for(lambda: all((jobs / node / "exit_code").exists()
                              for node in ("node1", "node-2"))
                  and report.exists() and "node-2: " in report.read_text())
        assert (jobs / "node1" / "exit_code").read_text().split()[0] == "3"
        assert (jobs / "node-2" / "stop_requested").exists()  # stopped, as a stop does it
        assert int((jobs / "node-2" / "exit_code").read_text().split()[0]) != 0
        assert report.read_text().splitlines() == [
            f"torchrun exited 3 on node1: stopping job {record.id} on node-2",
            "node-2: stopped"]
        calls = calls_file.read_text().splitlines()
        assert len(calls) == 1 and "BatchMode=yes" in calls[0], calls
        assert calls[0].endswith(f"node-2 sh {record.jobs_dir}/{record.id}/node-2/stop.sh")
        assert not (jobs / "node-2" / "stop-peers.log").exists()


@pytest.mark.parametrize("launcher_stops", [True, False])
def test_a_watched_node_whose_torchrun_fails_waits_for_its_launchers_stop(
        tmp_path: Path, launcher_stops: bool) -> None:
    """An attached launch: node1's torchrun fails; its launcher's stop (here the real
    stop script, run on node1 as the launcher's fail-fast runs it on every node) comes
    within the wait, and node1 stops no one; where none comes (the launcher's machine
    asleep), node1 stops node-2 itself once the wait is over."""
    with _two_nodes_one_failing(tmp_path, after_s=2) as (record, jobs, calls_file):
        wait_for((jobs / "node1" / "exit_code").exists)
        if launcher_stops:
            stop = node_scripts.stop_script(record, "node1", 1, None)
            subprocess.run(["sh", "-c", stop], capture_output=True, timeout=20, check=True)
        report = jobs / "node1" / "stop-peers.log"
        wait_for(lambda: report.exists() and len(report.read_text().splitlines()) > 1)
        lines = report.read_text().splitlines()
        assert lines[0] == (f"torchrun exited 3 on node1: stopping job {record.id} on "
                            f"node-2 unless its launcher does within 2 s")
        if launcher_stops:
            assert lines[1:] == ["its launcher stopped it"]
            assert not calls_file.exists()
            assert not (jobs / "node-2" / "exit_code").exists()  # node-2 runs on
        else:
            wait_for(lambda: "node-2: " in report.read_text())
            assert report.read_text().splitlines()[1:] == [
                "no stop from its launcher in 2 s: stopping it here", "node-2: stopped"]
            assert (jobs / "node-2" / "stop_requested").exists()


def test_a_stop_terms_torchrun_which_passes_it_on_to_each_worker_once(
        tmp_path: Path) -> None:
    """The stop TERMs torchrun, not its workers too: a worker TERMed twice ran its TERM
    handler (a checkpoint save) a second time inside the first. `jobs` meanwhile reads
    the node as stopping, then stopped."""
    from gpucluster.launch.control import states
    from gpucluster.remote.ssh import SshOptions

    with local_job(tmp_path) as (loaded, record):
        def state() -> tuple[str, int | None]:
            found = states(Session(loaded, SshOptions(tmp_path / "known_hosts")), loaded,
                           [record])[record.id]["node1"]
            return found.state, found.exit_code

        assert state() == ("running", None)
        with subprocess.Popen(["sh", "-c", node_scripts.stop_script(record, "node1", 5)],
                              stdout=subprocess.PIPE, text=True) as stopping:
            wait_for((tmp_path / "terms").exists)
            assert state() == ("stopping", None)  # the worker saves for a second
            said, _ = stopping.communicate(timeout=20)
        assert said.split()[:3] == ["@@gpc", "stop", "term"], said
        assert said.split()[4] == "-"  # nothing left
        assert (tmp_path / "terms").read_text() == "TERM\nsaved\n"
        exit_code = tmp_path / "jobs" / record.id / "node1" / "exit_code"
        wait_for(exit_code.exists)
        assert exit_code.read_text().split()[0] == "143"
        assert state() == ("stopped", 143)


def test_a_stop_continues_a_stopped_worker_so_that_it_takes_its_term(tmp_path: Path) -> None:
    """A worker stopped by a signal (Ctrl-Z, SIGSTOP) keeps the TERM torchrun passes on
    pending: the stop waited its grace, then KILLed it, and its save on TERM never ran.
    Continued once the TERM is out, it saves and ends; no KILL."""
    with local_job(tmp_path) as (_, record):
        os.kill(int((tmp_path / "worker.pid").read_text()), signal.SIGSTOP)
        said = subprocess.run(["sh", "-c", node_scripts.stop_script(record, "node1", 5)],
                              capture_output=True, text=True, timeout=30, check=True).stdout
    assert said.split()[:3] == ["@@gpc", "stop", "term"], said
    assert said.split()[4] == "-"  # nothing left
    assert (tmp_path / "terms").read_text() == "TERM\nsaved\n"


def test_a_hangs_stop_aborts_each_worker_first_and_its_python_stack_lands_in_the_log(
        tmp_path: Path) -> None:
    """The stop of a hang: each worker (torchrun's child), not torchrun, gets ABRT, and
    faulthandler (PYTHONFAULTHANDLER, which start sets) writes its stack to its stderr
    as it dies; the stop reports it by rank, from the rank's own file."""
    from gpucluster.launch.control import stop_result

    with local_job(tmp_path, LOGGING_TORCHRUN_STAND_IN) as (_, record):
        said = subprocess.run(["sh", "-c", node_scripts.stop_script(record, "node1", 5,
                                                                    dump_stacks=True)],
                              capture_output=True, text=True, timeout=30, check=True).stdout
    result = stop_result("node1", said)
    assert result.confirmed and list(result.stacks) == [3], said
    dump = result.stacks[3]
    assert dump[0] == "Fatal Python error: Aborted", dump
    assert any(re.match(r'  File ".*worker\.py", line 11 in <module>$', line) for line in dump)
    assert not (tmp_path / "terms").exists()  # it died of the abort, before any TERM
    # torchrun was not aborted: it saw its worker die and exited 1 by itself.
    exit_code = tmp_path / "jobs" / record.id / "node1" / "exit_code"
    wait_for(exit_code.exists)
    assert exit_code.read_text().split()[0] == "1"
    assert not list(tmp_path.glob("core*"))


def test_stop_with_stacks_says_where_each_rank_was(tmp_path: Path) -> None:
    """`gpucluster stop --stacks` of a job that hangs (not under --recover): each rank
    aborted first, its log fetched, and where it was said, in text and in JSON."""
    from typer.testing import CliRunner

    from gpucluster.cli.main import app
    from gpucluster.state import state_dir_for

    for json_output in (False, True):
        with local_job(tmp_path, LOGGING_TORCHRUN_STAND_IN) as (loaded, record):
            state = state_dir_for(loaded)
            JobStore(state).save(record)
            result = CliRunner().invoke(app, ["stop", "-i", str(loaded.path), record.id,
                                              "--stacks", *(["--json"] if json_output else [])])
        assert result.exit_code == 0, result.output
        if json_output:
            assert json.loads(result.stdout)["stacks"] == [
                {"ranks": [3], "where": "worker.py line 11 in <module>", "nodes": ["node1"],
                 "why": None}]
        else:
            kept = JobStore(state).directory(record.id) / "stacks.txt"
            assert result.stdout.splitlines()[-2:] == [
                f"where each rank was when it was stopped (each rank's whole stack: {kept}):",
                "  rank 3 (node1): worker.py line 11 in <module>"]
            assert kept.read_text().startswith("== rank 3 on node1 ==\nFatal Python error")
        assert not (tmp_path / "terms").exists()  # aborted, not TERMed
        shutil.rmtree(tmp_path / "jobs")  # the JSON run's stop reads files of its own
        shutil.rmtree(state)


# torchrun as a hang's stop meets it: two workers with no TERM handler of their own, the
# second stopped (SIGSTOP) before the stop comes, watched as torchrun watches them (here
# every 2 ms, torchrun's every 100): once one has failed, the others get TERM.
_WATCHING_TORCHRUN_STAND_IN = """
import os, signal, subprocess, sys, time
code = "import os, time\\nopen('ready-' + os.environ['LOCAL_RANK'], 'w').close()\\n" \\
       "time.sleep(60)\\n"
workers = []
for local in (0, 1, 2):
    logs = os.path.join(os.environ["GPC_JOB_DIR"], "torchrun", "j_x", "attempt_0", str(local))
    os.makedirs(logs)
    with open(os.path.join(logs, "stderr.log"), "w") as stderr:
        workers.append(subprocess.Popen(
            [sys.executable, "-c", code], start_new_session=True, stderr=stderr,
            env={**os.environ, "RANK": str(3 + local), "LOCAL_RANK": str(local)}))
with open("worker.pid", "w") as out: out.write(" ".join(str(w.pid) for w in workers))
while not all(os.path.exists(f"ready-{local}") for local in (0, 1, 2)):
    time.sleep(0.01)
os.kill(workers[2].pid, signal.SIGSTOP)  # the hang
open("ready", "w").close()
while all(w.poll() is None for w in workers):
    time.sleep(0.002)
for w in workers:
    if w.poll() is None:
        os.killpg(w.pid, signal.SIGTERM)
for w in workers:
    w.wait(10)
sys.exit(1)
"""


def test_a_hangs_stop_holds_torchrun_so_that_each_worker_dies_of_its_abort(
        tmp_path: Path) -> None:
    """torchrun TERMs its other workers as soon as one dies: a hang's stop that aborted
    them one after the other lost the second's stack (killed by that TERM while still
    frozen; a CI run, rank 5 of 8). torchrun is held until each has taken its abort;
    the rank stopped before the stop is said to be stopped, and where it was, as py-spy
    (beside this Python) read it before the abort (a rank killed by the TERM would read
    `it died without writing a stack`)."""
    from typer.testing import CliRunner

    from gpucluster.cli.main import app
    from gpucluster.state import state_dir_for

    with local_job(tmp_path, _WATCHING_TORCHRUN_STAND_IN) as (loaded, record):
        JobStore(state_dir_for(loaded)).save(record)
        result = CliRunner().invoke(app, ["stop", "-i", str(loaded.path), record.id,
                                          "--stacks", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["stacks"] == [
        {"ranks": [3, 4], "where": "<string> line 3 in <module>", "nodes": ["node1"],
         "why": None},
        {"ranks": [5], "where": "<string> line 3 in <module> (it was stopped: SIGSTOP, a "
                                "debugger; read by py-spy)", "nodes": ["node1"],
         "why": "stopped"}], result.output


def test_a_stop_that_takes_a_while_says_what_it_waits_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`gpucluster stop` of a job whose worker saves on TERM: a line on stderr once the
    stop has taken a while (here 0.2 s), then the stop's own report."""
    from typer.testing import CliRunner

    from gpucluster.cli import stop_cmd
    from gpucluster.cli.main import app
    from gpucluster.state import state_dir_for

    monkeypatch.setattr(stop_cmd, "STOP_NOTICE_AFTER_S", 0.2)
    with local_job(tmp_path) as (loaded, record):
        JobStore(state_dir_for(loaded)).save(record)
        result = CliRunner().invoke(app, ["stop", "-i", str(loaded.path), record.id,
                                          "--grace", "5"])
    assert result.exit_code == 0, result.output
    assert (f"gpucluster: job {record.id}: waiting for it to end on node1 (TERM sent to "
            f"its torchrun; KILL to what is left 5 s after it)") in result.stderr
    assert f"job {record.id} stopped: nothing of it is left on node1" in result.stdout


def test_the_leaders_own_commands_after_torchrun_outlive_a_stray_term(tmp_path: Path) -> None:
    """A stop that comes as torchrun ends TERMs the leader's children at its first look:
    once that was the leader's `mv` of the exit code (a CI run), and the node's exit code
    was never written. Here an `mv` that takes a second gets TERM meanwhile."""
    import shlex
    import sys

    record = dataclasses.replace(job_record(), hosts=["node1"], nproc_per_node={"node1": 1},
                                 jobs_dir=shlex.quote(str(tmp_path / "jobs")),
                                 code_dir=shlex.quote(str(tmp_path)))
    (tmp_path / "torchrun.py").write_text("import sys, time\ntime.sleep(0.5)\nsys.exit(3)\n")
    slow = tmp_path / "bin"
    stand_in(slow, "mv", f"case \"$*\" in *exit_code*) touch "
                         f"{shlex.quote(str(tmp_path / 'moving'))}; sleep 1;; esac\n"
                         f"exec {shutil.which('mv')} \"$@\"\n")
    start = node_scripts.start_script(record, "node1", f"{sys.executable} torchrun.py",
                                      "", False, None)
    ran = subprocess.run(["sh", "-c", start], capture_output=True, text=True, timeout=20,
                         check=True, env={**os.environ, "PATH": f"{slow}:{os.environ['PATH']}"})
    leader = int(ran.stdout.split("@@gpc started ")[1].split()[0])
    try:
        wait_for((tmp_path / "moving").exists)
        children = [int(stat.parent.name) for stat in Path("/proc").glob("[0-9]*/stat")
                    if _parent(stat) == leader]
        assert children  # the slow mv
        for child in children:
            os.kill(child, signal.SIGTERM)
        exit_code = tmp_path / "jobs" / record.id / "node1" / "exit_code"
        wait_for(exit_code.exists)
        assert exit_code.read_text().split()[0] == "3"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader, 9)


def _parent(stat: Path) -> int | None:
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_a_stop_that_finds_nothing_of_the_job_leaves_its_state_as_it_was(
        tmp_path: Path) -> None:
    """Nothing of the job left to stop (its leader killed before the stop came): the node
    reads `lost` as before the stop, not `stopped`, and the stop says it found nothing.
    The stop used to mark the node stopped before it looked for the job's processes, so
    a leader that wrote its exit code in between read `stopped` beside the stop's
    `had already ended`."""
    from gpucluster.launch.control import states
    from gpucluster.remote.ssh import SshOptions

    with local_job(tmp_path) as (loaded, record):
        def state() -> str:
            return states(Session(loaded, SshOptions(tmp_path / "known_hosts")), loaded,
                          [record])[record.id]["node1"].state

        leader = int((tmp_path / "jobs" / record.id / "node1" / "leader.pid").read_text())
        os.killpg(leader, signal.SIGKILL)  # the wrapper and torchrun: no exit code written
        worker = int((tmp_path / "worker.pid").read_text())
        os.kill(worker, signal.SIGKILL)
        wait_for(lambda: state() == "lost")
        said = subprocess.run(["sh", "-c", node_scripts.stop_script(record, "node1", 5)],
                              capture_output=True, text=True, timeout=20, check=True).stdout
        assert said.split()[:4] == ["@@gpc", "stop", "none", "0"], said
        assert state() == "lost"


def test_jobs_lists_an_older_job_that_still_runs_beside_the_newest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`jobs` shows the newest 10: a run that trained for days behind 11 newer jobs
    dropped off the list while it ran. An older job with processes on a node is listed
    too, and only while it has; once seen ended everywhere, its nodes are not asked
    about it again."""
    from typer.testing import CliRunner

    from gpucluster.cli.main import app
    from gpucluster.launch import control
    from gpucluster.state import state_dir_for

    asked: list[list[str]] = []
    real_states = control.states

    def states(*args: object, **kwargs: object) -> object:
        asked.append([r.id for r in args[2]])  # type: ignore[attr-defined]
        return real_states(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(control, "states", states)

    with local_job(tmp_path) as (loaded, record):
        store = JobStore(state_dir_for(loaded))
        store.save(record)
        newer = [dataclasses.replace(record, id=f"20261129-12{minute:02d}00-beef")
                 for minute in range(10, 21)]  # ended long ago: no trace left on node1
        for job in newer:
            store.save(job)

        def listed() -> list[str]:
            result = CliRunner().invoke(app, ["jobs", "-i", str(loaded.path), "--json"])
            assert result.exit_code == 0, result.output
            return [job["id"] for job in json.loads(result.stdout)["jobs"]]

        assert listed() == [record.id] + [job.id for job in newer[-10:]]
        subprocess.run(["sh", "-c", node_scripts.stop_script(record, "node1", 5)],
                       capture_output=True, timeout=20, check=True)
        wait_for((tmp_path / "jobs" / record.id / "node1" / "exit_code").exists)
        assert listed() == [job.id for job in newer[-10:]]
        assert record.id in asked[-1]  # seen stopped: not asked again
        assert listed() == [job.id for job in newer[-10:]] and record.id not in asked[-1]


def test_a_stop_of_the_newest_job_that_had_ended_names_an_older_one_still_running(
        tmp_path: Path) -> None:
    """`gpucluster stop` without JOB stops the newest job; where that one had already
    ended while an older one runs on, the line names the older one and how to stop it,
    and leaves it running."""
    from typer.testing import CliRunner

    from gpucluster.cli.main import app
    from gpucluster.state import state_dir_for

    with local_job(tmp_path) as (loaded, record):
        store = JobStore(state_dir_for(loaded))
        store.save(record)
        newest = dataclasses.replace(record, id="20261129-130000-beef")  # ended long ago
        store.save(newest)
        result = CliRunner().invoke(app, ["stop", "-i", str(loaded.path)])
        assert result.exit_code == 0, result.output
        assert result.stdout.split() == (
            f"job {newest.id} had already ended: nothing of it is left on node1; job "
            f"{record.id} still runs on node1: gpucluster stop {record.id} ends it").split()
        assert not (tmp_path / "terms").exists()  # the older job was not touched


def test_stop_all_stops_every_job_still_running_and_several_jobs_at_once(
        tmp_path: Path) -> None:
    """`stop --all`: each job launched from here with processes on a node (an ended one
    is not stopped again); `stop A B`: all at once, a line each in the order named."""
    from typer.testing import CliRunner

    from gpucluster.cli.main import app
    from gpucluster.state import state_dir_for

    with local_job(tmp_path) as (loaded, record):
        store = JobStore(state_dir_for(loaded))
        store.save(record)
        ended = dataclasses.replace(record, id="20261129-130000-beef")
        store.save(ended)
        runner = CliRunner()
        every = runner.invoke(app, ["stop", "-i", str(loaded.path), "--all", "--json"])
        assert every.exit_code == 0, every.output
        assert [job["job"] for job in json.loads(every.stdout)["jobs"]] == [record.id]
        assert (tmp_path / "terms").exists()  # the running one was TERMed
        again = runner.invoke(app, ["stop", "-i", str(loaded.path), "--all"])
        assert again.exit_code == 0 and again.stdout == ""
        assert "no job launched from here has processes on the nodes" in again.stderr
    both = runner.invoke(app, ["stop", "-i", str(loaded.path), record.id[-4:], "beef"])
    assert both.exit_code == 0, both.output
    assert [line.split(":")[0] for line in both.stdout.splitlines()] == [
        f"job {record.id} had already ended", f"job {ended.id} had already ended"]
    mixed = runner.invoke(app, ["stop", "-i", str(loaded.path), "--all", "beef"])
    assert isinstance(mixed.exception, GpuclusterError)  # main() makes it one line, exit 2
    assert "--all with JOBs named" in str(mixed.exception)


def test_a_stop_that_names_several_jobs_still_running_names_stop_all() -> None:
    import io

    from rich.console import Console

    from gpucluster.cli.views.launch import print_stopped
    from gpucluster.launch.model import StopResult

    out = io.StringIO()
    ended = {"node1": StopResult("node1", found=0, how="none")}
    print_stopped(Console(file=out, width=400), job_record(), ended,
                  still_running={"j1": ["node1"], "j2": ["node2", "node3"]})
    assert out.getvalue() == (
        f"job {job_record().id} had already ended: nothing of it is left on node1; job j1 "
        f"still runs on node1: gpucluster stop j1 ends it; job j2 still runs on node[2-3]: "
        f"gpucluster stop j2 ends it (gpucluster stop --all ends them all)\n")


def test_a_start_is_refused_by_failures_and_warnings_but_a_slow_login_or_uneven_gpus(
        ) -> None:
    """A slow login only slows the start, and GPU counts that differ where the inventory
    gives none are --nproc-per-node's business; a GPU count short of the inventory's, a
    driver that does not answer, or a job still running refuse it."""
    from gpucluster.doctor.model import CheckResult, Status
    from gpucluster.launch.preflight import refusing

    found = [CheckResult("ssh", "n1", Status.WARN, "login took 4.1s"),
             CheckResult("gpu-count", "n2", Status.WARN, "4 GPUs, the others 8"),
             CheckResult("gpu-count", "n3", Status.FAIL, "7 GPUs found, inventory expects 8"),
             CheckResult("nvidia-smi", "n4", Status.FAIL, "NVIDIA-SMI has failed"),
             CheckResult("jobs", "n5", Status.WARN, "job 20261204-1 still running"),
             CheckResult("gpu-processes", "n6", Status.OK, "no compute processes"),
             CheckResult("nvidia-smi", "n7", Status.SKIP, "no GPUs expected here")]
    assert [(r.name, r.host) for r in refusing(found)] == [
        ("gpu-count", "n3"), ("nvidia-smi", "n4"), ("jobs", "n5")]


def test_a_detached_start_checks_the_nodes_ssh_and_warns_without_refusing() -> None:
    """launch -d's nodes stop the job on the others themselves, over SSH: a node that
    cannot log in to the next is said before the start, which goes on."""
    from gpucluster.doctor.model import CheckResult, Status
    from gpucluster.launch.preflight import checks_for, mesh_warning, refusing

    attached = LaunchRequest("train.py", (), Path())
    detached = dataclasses.replace(attached, stop_peers_grace_s=30.0)
    assert "ssh-mesh" not in checks_for(attached)
    assert "ssh-mesh" in checks_for(detached)
    assert "torchrun" not in checks_for(dataclasses.replace(detached, image="img:1"))
    found = [CheckResult("ssh-mesh", "n1", Status.WARN, "...", "", {
                 "peer": "n2", "why": "Host key verification failed."}),
             CheckResult("ssh-mesh", "n2", Status.OK, "logs in to n3"),
             CheckResult("ssh-mesh", "n3", Status.WARN, "...", "", {
                 "peer": "n1", "why": "no login within 10 s"})]
    assert refusing(found) == []
    said = mesh_warning(found)
    assert said is not None and said.startswith(
        "warning: n[1,3] cannot log in to the next node over SSH (n1 to n2: Host key "
        "verification failed.; gpucluster doctor --only ssh-mesh names each): where the job "
        "fails on such a node, it is not stopped on the others")
    assert said.endswith("(fix: gpucluster provision --only ssh-mesh)")
    assert mesh_warning(found[1:2]) is None


def test_torchrun_words_and_the_container_command(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text("cluster:\n  torchrun: /opt/v env/bin/torchrun\nhosts:\n"
                    "  - {name: a, address: 10.0.0.1}\n  - {name: b, address: 10.0.0.2}\n")
    loaded = inventory_module.load(path)
    argv = torchrun_argv(loaded, TorchrunSpec("job1", 4, "train.py", ("--a", "x y"),
                                              max_restarts=2, log_dir="/l"))
    assert argv[:1] == ["/opt/v env/bin/torchrun"]
    assert argv[-3:] == ["train.py", "--a", "x y"]
    joined = " ".join(argv)
    assert "--rdzv-endpoint 10.0.0.1:29500" in joined and "--max-restarts 2" in joined
    assert "--log-dir /l --tee 3" in joined
    placed = torchrun_argv(loaded, TorchrunSpec("job1", 4, "train.py", local_addr="10.0.0.2"))
    assert placed[-3:] == ["--local_addr", "10.0.0.2", "train.py"]
    module = torchrun_argv(loaded, TorchrunSpec("job1", 4, "pkg.train", ("--a",), module=True))
    assert module[-3:] == ["-m", "pkg.train", "--a"]
    container = node_scripts.Container("reg/img:1", "gpucluster-job1", True,
                                       ["GPUCLUSTER_JOB", "NCCL_SOCKET_IFNAME"])
    command = node_scripts.container_command(container, "torchrun --nnodes 2", "/srv/images")
    assert re.search(r'"\$GPC_RT" run --rm --name gpucluster-job1 --network host --ipc host '
                     r"\$\(case .* nvidia.com/gpu=all", command)
    assert "-e GPUCLUSTER_JOB -e NCCL_SOCKET_IFNAME reg/img:1 torchrun --nnodes 2" in command
    sif = node_scripts.Container("/home/me/train.sif", "gpucluster-job1", False, [])
    assert node_scripts.container_command(sif, "torchrun x", "/srv/images") == (
        '"$GPC_RT" exec --bind "$PWD" --bind "$GPC_JOB_DIR" --bind '
        '"$GPUCLUSTER_CHECKPOINT_DIR" --pwd "$PWD" /srv/images/train.sif torchrun x')
    # The start checks the image is where the command takes it from: never pulled
    assert node_scripts.image_check(sif, "/srv/images") == "[ -f /srv/images/train.sif ]"
    image = node_scripts.Container("reg/my img:1", "gpucluster-job1", True, [])
    assert node_scripts.image_check(image, "/srv/images") == (
        "${GPC_SUDO:+sudo -n} \"$GPC_RT\" image inspect 'reg/my img:1' >/dev/null 2>&1")


def test_a_torchrun_under_the_home_is_found_there_and_every_other_word_kept(
        tmp_path: Path) -> None:
    tools = tmp_path / "v env" / "bin"
    tools.mkdir(parents=True)
    (tools / "torchrun").write_text('#!/bin/sh\nprintf "%s\\n" "$0" "$@"\n')
    (tools / "torchrun").chmod(0o755)
    path = tmp_path / "inventory.yaml"
    path.write_text("cluster:\n  torchrun: ~/v env/bin/torchrun\nhosts: [a]\n")
    argv = torchrun_argv(inventory_module.load(path),
                         TorchrunSpec("job1", 1, "train.py", ("~/x", "$HOME", "a b")))
    line = command_line(argv, {"job1": '"$JOB"'})
    words = subprocess.run(["/bin/sh", "-c", line], env={"HOME": str(tmp_path), "JOB": "j"},
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert words[0] == f"{tools}/torchrun"
    assert words[words.index("--rdzv-id") + 1] == "j"
    assert words[-4:] == ["train.py", "~/x", "$HOME", "a b"]


def test_more_processes_than_gpus_is_refused_where_jobs_use_gpus(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text("defaults: {gpus: 8}\nhosts:\n  - name: gpu[1-2]\n"
                    "  - {name: small, gpus: 4}\n  - {name: cpu1, torch_device: cpu}\n")
    loaded = inventory_module.load(path)
    for fits in (None, 1, 4):
        check_nproc(loaded, fits)
    with pytest.raises(GpuclusterError) as refused:
        check_nproc(loaded, 5)
    assert str(refused.value) == ("--nproc-per-node 5: small has 4 GPUs (the inventory's "
                                  "gpus) (fix: --nproc-per-node 4 or fewer, one process per "
                                  "GPU, or correct gpus: in the inventory)")
    with pytest.raises(GpuclusterError, match=r"gpu\[1-2\],small have 4 GPUs"):
        check_nproc(loaded, 99)
    cpu_only = inventory_module.load(path).restricted_to([loaded.host("cpu1")])
    check_nproc(cpu_only, 99)  # on the CPU, as many as asked


def test_without_gpus_in_the_inventory_a_process_per_gpu_the_checks_found(
        tmp_path: Path) -> None:
    """An inventory without `gpus:` ran one process per node, one GPU of eight busy; and
    two processes on the H200 machine's one GPU would have met NCCL's "Duplicate GPU"."""
    from gpucluster import reports
    from gpucluster.launch.request import gpus_found
    from gpucluster.nproc import nproc_for

    probe = (Path(__file__).parents[1] / "fixtures" / "h200" / "probe-idle.txt").read_text()
    counts = gpus_found({"one": reports.sections(probe), "bare": {}})
    # the real H200's answer; no nvidia-smi: none
    assert counts == {"one": GpuCount(1, mig=0), "bare": GpuCount(0, mig=0)}
    found = {node: count.gpus for node, count in counts.items()}
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  - one\n  - bare\n  - {name: set, gpus: 4}\n"
                    "  - {name: cpu, torch_device: cpu}\n")
    loaded = inventory_module.load(path)
    eight = {"one": 8, "bare": 0, "set": 8, "cpu": 8}
    assert {h.name: nproc_for(h, None, eight[h.name]) for h in loaded.hosts} == {
        "one": 8, "bare": 1, "set": 4, "cpu": 1}  # the inventory's gpus win
    assert nproc_for(loaded.host("one"), 2, 8) == 2  # as asked
    only_one = inventory_module.load(path).restricted_to([loaded.host("one")])
    check_nproc(only_one, 1, found)
    with pytest.raises(GpuclusterError) as refused:
        check_nproc(only_one, 2, found)
    assert str(refused.value) == ("--nproc-per-node 2: one has 1 GPU (found there) (fix: "
                                  "--nproc-per-node 1 or fewer, one process per GPU)")
    check_nproc(only_one, 2)  # nothing found yet: the checks have not run


def test_more_than_one_process_a_node_is_refused_where_its_gpus_are_in_mig_mode(
        tmp_path: Path) -> None:
    """The real H100 MIG capture's GPU says `Enabled`: CUDA gives a process one of its MIG
    devices, so a node's second rank would find no GPU of its own."""
    from gpucluster import reports
    from gpucluster.launch.request import gpus_found
    from gpucluster.sandbox import captures

    rows = captures.load("h100-mig").section("idle", "query-gpu")
    counts = gpus_found({"mig": reports.sections(f"@@gpc section gpus\n{rows}@@gpc end 0\n")})
    assert counts == {"mig": GpuCount(1, mig=1)}
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  - mig\n  - {name: whole, gpus: 8}\n"
                    "  - {name: cpu, torch_device: cpu}\n")
    loaded = inventory_module.load(path)
    eight = {"mig": GpuCount(8, mig=8), "whole": GpuCount(8, mig=0), "cpu": GpuCount(8, mig=8)}
    with pytest.raises(GpuclusterError) as refused:
        check_fit(loaded, None, eight)
    assert str(refused.value) == (
        "mig: 8 GPUs in MIG mode, where CUDA gives a process one MIG device: of 8 processes "
        "a node, 7 would find no GPU (fix: to train on whole GPUs, turn MIG off there: sudo "
        "nvidia-smi -mig 0, then reset the GPUs, as `gpucluster doctor --only mig` says; or "
        "--nproc-per-node 1, one process a node on one MIG device)")
    # One process a node, or jobs on the CPU: nothing to refuse.
    assert check_fit(loaded, 1, eight) == {"mig": 8, "whole": 8, "cpu": 8}
    cpu_only = loaded.restricted_to([loaded.host("cpu")])
    check_fit(cpu_only, None, eight)


def test_sync_summary_folds_identical_nodes() -> None:
    same = workdir.SyncResult(1, 0, 2, 2048)
    text = sync_summary({"n1": same, "n2": same, "n3": workdir.SyncResult(3, 0, 0, 307 << 20)})
    assert text == ("synced: 1 sent (2 KiB), 0 deleted, 2 unchanged on n[1-2]; "
                    "3 sent (307 MiB), 0 deleted, 0 unchanged on n3")
    assert sync_summary({"n1": same}, planned=True) == \
        "1 to send (2 KiB), 0 to delete, 2 unchanged on n1"  # launch's, said before the start


def test_a_large_sync_names_its_largest_files() -> None:
    def plan(*sizes: tuple[str, int]) -> workdir.SyncPlan:
        return workdir.SyncPlan(tuple(workdir.LocalFile(p, n, 0, 0o644) for p, n in sizes),
                                (), 0)
    code = ("train.py", 7 << 10)
    assert large_files_note({"n1": plan(code), "n2": plan(code)}) is None
    data, ckpt = ("data/train.bin", 300 << 20), ("last.ckpt", 1536 << 20)
    note = large_files_note({"n1": plan(code, data, ckpt), "n2": plan(data)})
    assert note is not None and note.startswith(
        "1.8 GiB to send to a node; the largest files: last.ckpt (1.5 GiB), data/train.bin "
        "(300 MiB); ")
    assert ".gpuclusterignore" in note
    many = large_files_note({"n1": plan(*((f"f{i}", 1 << 20) for i in range(120)))})
    assert many is not None and "the largest files: 120 files, none of them large" in many


def test_launch_input_errors_are_one_line(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("hosts: [a, b]\n")
    (tmp_path / "train.py").write_text("")
    for pair in ("1X=2", "é=2"):  # é is a Python identifier but no shell's name
        bad_env = gpucluster("launch", "-i", str(inventory), "--env", pair, "train.py",
                             cwd=str(tmp_path))
        assert bad_env.code == 2
        assert bad_env.stderr == (f"gpucluster: error: --env {pair!r}: expected NAME=VALUE, "
                                  f"NAME of ASCII letters, digits and _ (fix: e.g. --env "
                                  f"NCCL_DEBUG=INFO)\n")
    bare = gpucluster("launch", "-i", str(inventory), "--env", "HF_TOKEN", "train.py",
                      cwd=str(tmp_path))  # docker's -e NAME: the value from this shell
    assert bare.code == 2
    assert bare.stderr == ("gpucluster: error: --env HF_TOKEN: expected NAME=VALUE (fix: "
                           "--secret-env HF_TOKEN passes $HF_TOKEN from this shell, its value "
                           "never written down; or --env HF_TOKEN=VALUE)\n")
    missing = gpucluster("launch", "-i", str(inventory), "nope.py", cwd=str(tmp_path))
    assert missing.code == 2 and "Traceback" not in missing.stderr
    assert re.fullmatch(r"gpucluster: error: nope\.py: no such file in \S+ \(fix: .*\)\n",
                        missing.stderr)
    container = gpucluster("launch", "-i", str(inventory), "--container", "train.py",
                           cwd=str(tmp_path))
    assert container.code == 2 and "needs cluster.image" in container.stderr
    unset = gpucluster("launch", "-i", str(inventory), "--image", "", "train.py",
                       cwd=str(tmp_path))  # `--image "$IMAGE"`, the variable unset
    assert unset.code == 2 and unset.stderr.startswith("gpucluster: error: --image '': no im")
    no_jobs = gpucluster("logs", "-i", str(inventory))
    assert no_jobs.code == 2 and "no jobs recorded" in no_jobs.stderr


def test_a_home_directory_or_the_root_is_never_the_work_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`cd ~ && gpucluster launch train.py` would copy ~/.ssh's private keys, ~/.aws and
    every dataset under the home to every node."""
    home = tmp_path / "home"
    _tree(home, {"train.py": "x", ".ssh/id_ed25519": "PRIVATE"})
    monkeypatch.setenv("HOME", str(home))
    for workdir_path, what in ((home, "your home directory"), (Path("/"), "the root directory")):
        with pytest.raises(GpuclusterError) as refused:
            check_request(LaunchRequest("train.py", (), workdir_path))
        assert str(refused.value) == (
            f"{workdir_path} is {what}: launch would copy all of it to every node (fix: "
            f"run from the project's directory, or give it with --workdir DIR)")
    _tree(home, {"proj/train.py": "x"})
    assert check_request(LaunchRequest("train.py", (), home / "proj"))[1] == "train.py"


def test_a_module_is_run_with_dash_m_from_the_work_dir(tmp_path: Path) -> None:
    """launch -m pkg.train: torchrun -m, as `python -m` from the work dir; the module's
    file, when the work dir has it, must be one the sync sends."""
    _tree(tmp_path, {"pkg/__init__.py": "", "pkg/train.py": "x", "app/__main__.py": "y",
                     "skip/job.py": "z", ".gpuclusterignore": "skip/\n"})

    def request(name: str) -> LaunchRequest:
        return LaunchRequest(name, (), tmp_path, module=True)

    assert check_request(request("pkg.train"))[1] == "pkg.train"
    assert check_request(request("app"))[1] == "app"  # a package with __main__
    assert check_request(request("torch.utils.collect_env"))[1] == (  # installed on nodes
        "torch.utils.collect_env")
    for bad, fix in (("pkg/train.py", "-m pkg.train"), ("pkg.train.py", "-m pkg.train"),
                     ("2fast", "give it dotted"), ("pkg..train", "give it dotted")):
        with pytest.raises(GpuclusterError, match=rf"^-m {re.escape(bad)}: not a Python "
                                                  rf"module name \(fix: {fix}"):
            check_request(request(bad))
    with pytest.raises(GpuclusterError, match=r"skip/job\.py is excluded from the sync"):
        check_request(request("skip.job"))
    record = JobRecord("20261202-120000-abcd", "pkg.train", ["--lr", "0.1"], ["n1"], "/c",
                       "/j", 0.0, {"n1": 1}, module=True)
    assert record.command() == "-m pkg.train --lr 0.1"
    assert dataclasses.replace(record, module=False).command() == "pkg.train --lr 0.1"
    # As a shell would take it back: `jobs` shows where one word ends.
    spaced = dataclasses.replace(record, module=False, script="my run.py",
                                 args=["a b", "$(id)", "it's"])
    assert spaced.command() == """'my run.py' 'a b' '$(id)' 'it'"'"'s'"""


def test_logs_refuses_ranks_the_job_never_had(tmp_path: Path) -> None:
    """--rank 9 of a 4-rank job printed nothing and exited 0, as if rank 9 were silent;
    --rank 0-99999999999 built a list of that many numbers."""
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  - {name: n1, address: 192.0.2.1}\n"
                    "  - {name: n2, address: 192.0.2.2}\n")
    JobStore(tmp_path / ".gpucluster").save(JobRecord(
        "20261202-120000-abcd", "t.py", [], ["n1", "n2"], "/c", "/j", 0.0, {"n1": 2, "n2": 2}))
    beyond = gpucluster("logs", "-i", str(path), "--rank", "9", "--connect-timeout", "1")
    assert beyond.code == 2
    assert beyond.stderr == ("gpucluster: error: --rank 9: job 20261202-120000-abcd had ranks "
                             "0-3 (fix: --rank within them)\n")
    huge = gpucluster("logs", "-i", str(path), "--rank", "0-99999999999")
    assert huge.code == 2 and "--rank '0-99999999999': ranks go up to" in huge.stderr
    backwards = gpucluster("logs", "-i", str(path), "--rank", "5-3")
    assert backwards.code == 2 and "(fix: e.g. --rank 3 or --rank 0,4-7)" in backwards.stderr
    superscript = gpucluster("logs", "-i", str(path), "--rank", "²")  # int() refuses it
    assert superscript.code == 2 and "--rank '²': expected global ranks" in superscript.stderr
    # An unset variable (`--rank "$R"`, `-w "$NODE"`) filters nothing out: an error.
    no_rank = gpucluster("logs", "-i", str(path), "--rank", "")
    assert no_rank.code == 2 and "--rank '': expected global ranks" in no_rank.stderr
    no_node = gpucluster("logs", "-i", str(path), "-w", "")
    assert no_node.code == 2 and "--hosts '' names no host" in no_node.stderr
    # launch --show-ranks reads ranks the same way, naming its own option; refused before
    # anything is asked of a node (these addresses answer nothing).
    shown = gpucluster("launch", "-i", str(path), "--show-ranks", "2-1", "t.py")
    assert shown.code == 2 and "--show-ranks '2-1': expected global ranks from 0" in \
        shown.stderr and "(fix: e.g. --show-ranks 3 or --show-ranks 0,4-7)" in shown.stderr


def test_the_script_is_found_inside_the_work_dir_wherever_launch_runs(tmp_path: Path) -> None:
    _tree(tmp_path, {"proj/src/train.py": "x", "proj/skip/t.py": "y", "elsewhere.py": "z",
                     "proj/.gpuclusterignore": "skip/\n"})
    project = tmp_path / "proj"

    def request(script: str) -> LaunchRequest:
        return LaunchRequest(script, (), project)

    assert check_request(request("src/train.py"))[1] == "src/train.py"  # cwd is not proj
    assert check_request(request(str(project / "src" / "train.py")))[1] == "src/train.py"
    for outside in (str(tmp_path / "elsewhere.py"), "../elsewhere.py"):
        with pytest.raises(GpuclusterError, match=r"elsewhere\.py is outside the work "
                                                  r"directory \S+/proj, .*\(fix: .*-C DIR"):
            check_request(request(outside))
    with pytest.raises(GpuclusterError, match=r"src/none\.py: no such file in"):
        check_request(request("src/none.py"))
    for directory in ("src", ".", str(tmp_path)):  # inside the work dir or not
        with pytest.raises(GpuclusterError, match=rf"^{re.escape(directory)} is a directory, "
                                                  r"not a script \(fix: name the script in "):
            check_request(request(directory))
    with pytest.raises(GpuclusterError, match=r"skip/t\.py is excluded from the sync"):
        check_request(request("skip/t.py"))
    # A link to a script outside: the nodes would get the link, not the script.
    (project / "ext.py").symlink_to(tmp_path / "elsewhere.py")
    with pytest.raises(GpuclusterError, match=r"^ext\.py is a link to \S+/elsewhere\.py, "
                                              r"outside \S+/proj: the nodes get the link"):
        check_request(request("ext.py"))
    (project / "main.py").symlink_to("src/train.py")  # inside: torchrun runs its target
    assert check_request(request("main.py"))[1] == "src/train.py"


def test_markers_are_matched_literally_by_grep() -> None:
    record = JobRecord("20261129-120000-abcd", "t.py", [], ["a.b"], "/c", "/j", 0.0, {})
    pattern = node_scripts.ere_escape(f"GPUCLUSTER_JOB={record.marker('a.b')}")
    lines = f"GPUCLUSTER_JOB={record.marker('a.b')}\nGPUCLUSTER_JOB={record.id}@aXb\n"
    found = subprocess.run(["grep", "-x", "-E", "-e", pattern], input=lines,
                           capture_output=True, text=True, check=False)
    assert found.stdout == f"GPUCLUSTER_JOB={record.id}@a.b\n"
    assert found.stderr == ""  # no "stray \\" warnings
    anyjob = subprocess.run(["grep", "-x", "-E", "-e", node_scripts.any_job_pattern("a.b")],
                            input=lines, capture_output=True, text=True, check=False)
    assert anyjob.stdout == found.stdout


def test_a_broken_job_record_is_a_one_line_error(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    (store.directory("20261129-120000-abcd")).mkdir(parents=True)
    (store.directory("20261129-120000-abcd") / "job.json").write_text("{not json")
    with pytest.raises(GpuclusterError, match=r"job\.json: not a readable job record"):
        store.load(None)


def test_stop_gives_container_engines_whole_seconds_and_checks_the_container() -> None:
    record = dataclasses.replace(job_record(), image="busybox:latest")
    script = node_scripts.stop_script(record, "node1", 2.5, "/usr/bin/docker")
    assert "stop -t 3 " in script and "stop -t 2.5" not in script
    assert "@@gpc container-left" in script and "ps -q --filter name=^gpucluster-" in script


def test_logs_f_of_an_old_job_ends_when_its_leader_pid_was_reused(tmp_path: Path) -> None:
    import shlex

    from gpucluster import reports
    from gpucluster.remote.local import LocalConnection

    record = dataclasses.replace(job_record(), jobs_dir=shlex.quote(str(tmp_path)))
    job = tmp_path / record.id
    job.mkdir()
    (job / "node.log").write_text("[0]:epoch 5 done\n")
    (job / "exit_code").write_text("0 1700000000.0\n")
    stranger = subprocess.Popen(["sleep", "60"])  # took the old leader's pid, no marker
    try:
        (job / "leader.pid").write_text(f"{stranger.pid}\n")
        result = LocalConnection("here").run(
            node_scripts.follow_script(record, "node1", follow=True), timeout=15)
    finally:
        stranger.kill()
        stranger.wait()
    assert "[0]:epoch 5 done" in result.stdout
    assert reports.by_kind(result.stdout)["state"] == ["exited 0 1700000000.0"]


@pytest.mark.parametrize("leader_ended", [True, False])
def test_processes_left_after_the_leader_ended_are_leftovers_not_a_running_job(
        tmp_path: Path, leader_ended: bool) -> None:
    """torchrun killed (the OOM killer's pick) orphans its workers, which still carry the
    job's marker: the node's part of the job failed. They used to make it `running`, so
    launch followed the other nodes as if nothing had happened and `jobs` said running."""
    import shlex

    from gpucluster import reports
    from gpucluster.remote.local import LocalConnection

    record = dataclasses.replace(job_record(), jobs_dir=shlex.quote(str(tmp_path)))
    job = tmp_path / record.id / "node1"
    job.mkdir(parents=True)
    (job / "node.log").write_text("[0]:epoch 1\n")
    marked = {**os.environ, "GPUCLUSTER_JOB": record.marker("node1")}
    worker = subprocess.Popen(["sleep", "60"], env=marked)
    leader = subprocess.Popen(["sleep", "60"], env=marked if not leader_ended else None)
    try:  # an ended leader: its pid now another process's, without the marker
        (job / "leader.pid").write_text(f"{leader.pid}\n")
        if leader_ended:
            (job / "exit_code").write_text("137 1700000000.0\n")
        shell = LocalConnection("here")
        followed = shell.run(node_scripts.follow_script(record, "node1", follow=False),
                             timeout=15)
        listed = shell.run(node_scripts.state_script([record], "node1", record.jobs_dir),
                           timeout=15)
    finally:
        for process in (worker, leader):
            process.kill()
            process.wait()
    expected = "leftover 137 1700000000.0" if leader_ended else "running -"
    assert reports.by_kind(followed.stdout)["state"] == [expected]
    assert reports.by_kind(listed.stdout)["job"] == [f"{record.id} {expected}"]
    state = parse_state("node1", expected)
    assert state.failed is leader_ended
    assert not parse_state("node1", "leftover 0").failed  # the script left a process


@pytest.mark.parametrize("shell", ["bash", "sh"])
def test_following_a_job_beats_and_ends_with_its_state_and_stamps(tmp_path: Path,
                                                                  shell: str) -> None:
    """Its heartbeat waits fork no `sleep` under bash (a job that never writes its
    heartbeat file is followed for days); sh, which has no timed read, still works.
    The follow ends with the leader even while nobody reaps it: a zombie answers
    `kill -0` as a live process does, and an init may take seconds to reap, or never."""
    import shlex

    from gpucluster import reports
    from gpucluster.remote.local import LocalConnection

    record = dataclasses.replace(job_record(), jobs_dir=shlex.quote(str(tmp_path)))
    job = tmp_path / record.id / "node1"
    job.mkdir(parents=True)
    (job / "node.log").write_text("[0]:epoch 1\n[0]:epoch 2\n")
    (job / "node.times").write_text("1700000001.5\n1700000002.5\n")
    fake = tmp_path / "bin"
    fake.mkdir()
    naps = tmp_path / "naps"
    (fake / "sleep").write_text(f'#!/bin/sh\necho "$1" >> {naps}\nexec /bin/sleep "$@"\n')
    (fake / "sleep").chmod(0o755)
    leader = subprocess.Popen(["/bin/sleep", "1.5"],
                              env={**os.environ, "GPUCLUSTER_JOB": record.marker("node1")})
    try:  # not reaped until the follow has ended: a zombie meanwhile
        (job / "leader.pid").write_text(f"{leader.pid}\n")
        script = node_scripts.follow_script(record, "node1", follow=True)
        result = LocalConnection("here").run(
            f"PATH={shlex.quote(str(fake))}:$PATH exec {shell} -c {shlex.quote(script)}",
            timeout=15)
        state = Path(f"/proc/{leader.pid}/stat").read_text().rsplit(") ", 1)[1].split()[0]
    finally:
        leader.wait()
    assert state == "Z"
    found = reports.by_kind(result.stdout)
    assert result.stdout.startswith("[0]:epoch 1\n[0]:epoch 2\n")
    assert found["state"] == ["lost -"] and "times" in found  # no exit code was written
    assert result.stdout.rstrip().endswith("1700000001.5\n1700000002.5")
    assert "@@gpc alive - " in result.stderr
    napped = naps.read_text().split() if naps.exists() else []
    assert napped == [] if shell == "bash" else napped.count("0.5") >= 2
    assert not list(job.glob(".nap*"))  # the fifo is gone


def _job_on_this_machine(tmp_path: Path
                         ) -> tuple[inventory_module.Inventory, Session, JobRecord, Path]:
    """An inventory of node1 as this machine (connection: local), a session on it, a job
    of node1 alone with its jobs dir under tmp_path, and node1's dir of that job (made)."""
    import shlex

    from gpucluster.remote.ssh import SshOptions

    inventory = tmp_path / "c.yaml"
    inventory.write_text("hosts:\n  - {name: node1, address: 127.0.0.1, connection: local}\n")
    loaded = inventory_module.load(inventory)
    record = dataclasses.replace(job_record(), hosts=["node1"], nproc_per_node={"node1": 1},
                                 jobs_dir=shlex.quote(str(tmp_path / "node-jobs")))
    job = tmp_path / "node-jobs" / record.id / "node1"
    job.mkdir(parents=True)
    return loaded, Session(loaded, SshOptions(tmp_path / "known_hosts")), record, job


def test_a_copy_here_that_cannot_be_written_ends_the_follow_all_the_same(
        tmp_path: Path) -> None:
    """The controller's disk full (here /dev/full, written through the copy's path): the
    follower died of the copy's ENOSPC, its node's end never came, and launch waited
    for ever while the job had ended. The follow ends with the node's state, every line
    still handed on, and the copy said to be cut short."""
    from gpucluster.launch.follow import follow

    loaded, session, record, job = _job_on_this_machine(tmp_path)
    lines = [f"[0]:line {i} " + "x" * 100 for i in range(2000)]  # past any write buffer
    (job / "node.log").write_text("".join(f"{line}\n" for line in lines))
    (job / "exit_code").write_text("0\n")
    (job / "leader.pid").write_text("2147483647\n")  # beyond pid_max: ended
    store = JobStore(tmp_path / ".gpucluster")
    store.directory(record.id).mkdir(parents=True)
    store.node_log(record.id, "node1").symlink_to("/dev/full")
    # where a copy written again goes, beside the one before until it replaces it
    store.node_log(record.id, "node1").with_name("node1.part").symlink_to("/dev/full")
    shown: list[str] = []
    ended: list[JobOutcome] = []
    following = threading.Thread(target=lambda: ended.append(follow(
        session, loaded, record, store,
        on_output=lambda _node, _rank, text: shown.append(text), live=False,
        fail_fast=False)), daemon=True)
    following.start()
    following.join(30)
    assert ended, "the follow never ended"
    outcome = ended[0]
    assert outcome.states["node1"].state == "exited" and outcome.exit_code == 0
    assert outcome.copies_cut == {"node1": "No space left on device"}
    assert len(shown) == len(lines) and shown[-1] == lines[-1].removeprefix("[0]:")


def test_a_failure_is_read_from_the_log_itself_where_another_process_writes_the_copy(
        tmp_path: Path) -> None:
    """An attached launch stopped with Ctrl-Z holds the copy of a node's log, far behind
    it; `jobs` reading the job's failure meanwhile took that copy for the log and noted
    `node1: exited 1` for good. The follow now reads the failure from what it read."""
    import fcntl

    from gpucluster.launch.failure import in_a_line
    from gpucluster.launch.follow import follow

    loaded, session, record, job = _job_on_this_machine(tmp_path)
    (job / "node.log").write_text(
        "[2]:started\n[2]:Traceback (most recent call last):\n[2]:  File \"t.py\", line 3\n"
        "[2]:ValueError: bad shard 7\nRoot Cause (first observed failure):\n[0]:\n"
        "  time      : 2026-12-06_18:27:26\n  host      : node1\n"
        "  rank      : 2 (local_rank: 0)\n  exitcode  : 1 (pid: 2183)\n")
    (job / "exit_code").write_text("1 1700000000.0\n")
    (job / "leader.pid").write_text("2147483647\n")  # beyond pid_max: ended
    store = JobStore(tmp_path / ".gpucluster")
    store.directory(record.id).mkdir(parents=True)
    copy = store.node_log(record.id, "node1")
    copy.write_text("[2]:started\n")  # the stopped launcher's, so far
    with (copy.parent / "node1.copy-lock").open("ab") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as that launcher holds it
        outcome = follow(session, loaded, record, store, live=False, fail_fast=False,
                         stop_on_interrupt=False)
    assert copy.read_text() == "[2]:started\n"  # that one's to write
    assert outcome.first_failure is not None
    assert in_a_line(outcome.first_failure) == "rank 2 on node1: ValueError: bad shard 7"


def test_the_line_stamper_ends_with_a_zombie_leader_and_stamps_every_line(
        tmp_path: Path) -> None:
    """start.sh's stamper: one stamp per line of node.log, lines written while it runs
    included, and it ends with the leader even while nobody reaps it (it used to wait
    with `tail --pid` on the leader, which a zombie satisfies), forking no `sleep`."""
    job = tmp_path / "job"
    job.mkdir()
    log = job / "node.log"
    log.write_text("[0]:one\n[0]:two\n")
    fake = tmp_path / "bin"
    fake.mkdir()
    naps = tmp_path / "naps"
    (fake / "sleep").write_text(f'#!/bin/sh\necho "$1" >> {naps}\nexec /bin/sleep "$@"\n')
    (fake / "sleep").chmod(0o755)
    leader = subprocess.Popen(["/bin/sh", "-c", f"sleep 0.6; echo '[1]:three' >> {log}"])
    try:  # not reaped until the stamper has ended: a zombie meanwhile
        stamper = subprocess.run(
            ["bash", "-c", node_scripts.stamper_script(), "stamp", str(leader.pid), str(job)],
            env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}, timeout=10,
            check=True)
        state = Path(f"/proc/{leader.pid}/stat").read_text().rsplit(") ", 1)[1].split()[0]
    finally:
        leader.wait()
    assert stamper.returncode == 0 and state == "Z"
    stamps = (job / "node.times").read_text().split()
    assert len(stamps) == 3 and all(float(s) > 1.7e9 for s in stamps)
    assert float(stamps[2]) - float(stamps[0]) > 0.4  # stamped as written, not at the end
    assert not naps.exists()  # waits are timed reads under bash
    assert not list(job.glob(".nap*"))


def test_sync_streams_a_large_work_dir_to_a_node(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import shlex

    from gpucluster.remote.local import LocalConnection

    monkeypatch.setattr(workdir, "SHARED_TAR_LIMIT", 1 << 20)  # past it: streamed

    source = tmp_path / "project"
    _tree(source, {"train.py": "print(1)", "data/big.bin": ""})
    with (source / "data/big.bin").open("wb") as handle:
        handle.write(os.urandom(1 << 20) * 40)  # 40 MiB: more than a pipe holds
    target = tmp_path / "node" / "project"
    local = workdir.local_files(source)
    result = workdir.sync(LocalConnection("here"), source, local, shlex.quote(str(target)))
    assert result.sent == 2 and result.bytes_sent >= 40 << 20
    assert (target / "data/big.bin").read_bytes() == (source / "data/big.bin").read_bytes()
    again = workdir.sync(LocalConnection("here"), source, local, shlex.quote(str(target)))
    assert again.sent == 0 and again.unchanged == 2


def test_nodes_that_lack_the_same_files_share_one_tar_made_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A work dir of code is thousands of small files: encoded once per node, one node
    after another under the GIL, they cost the controller 1.5 s per node for 30000."""
    source = tmp_path / "project"
    _tree(source, {"train.py": "print(1)", "lib/a.py": "a", "lib/b.py": "b"})
    local = workdir.local_files(source)
    everything, some = tuple(local.values()), (local["lib/a.py"],)
    made: list[int] = []
    write_tar = workdir.write_tar

    def counted(target: io.BytesIO, *args: object) -> None:
        made.append(1)
        write_tar(target, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(workdir, "write_tar", counted)
    sends = {"n1": everything, "n2": everything, "n3": some}
    with workdir.tar_streams(source, sends, sorted(local)) as tars:
        sent = {node: tar.read() for node, tar in tars.items()}
    assert len(made) == 2 and sent["n1"] == sent["n2"] != sent["n3"]
    assert all(workdir.sent_gzipped(send) for send in sends.values())
    for node in ("n1", "n3"):  # gzipped, whole, as the node's apply reads it
        target = tmp_path / node
        target.mkdir()
        applied = subprocess.run(
            ["sh", "-c", workdir.apply_command(str(target), (), node, gzipped=True)],
            input=sent[node], capture_output=True, timeout=30, check=False)
        assert applied.returncode == 0, applied.stderr
    assert (tmp_path / "n1/lib/b.py").read_text() == "b"
    assert sorted(p.name for p in (tmp_path / "n3/lib").iterdir()) == ["a.py"]
    # Above the limit, each node's tar is streamed as it is read, none held in memory.
    monkeypatch.setattr(workdir, "GZIP_LIMIT", 512)  # a tar of data: made once, as it is
    with workdir.tar_streams(source, {"n1": everything}, sorted(local)) as tars:
        assert isinstance(tars["n1"], io.BytesIO)
        with tarfile.open(fileobj=tars["n1"], mode="r|") as plain:  # not gzipped
            assert plain.getnames()[0] == everything[0].path
    monkeypatch.setattr(workdir, "SHARED_TAR_LIMIT", 512)
    assert not workdir.shares_tar(everything)
    with workdir.tar_streams(source, {"n1": everything}, sorted(local)) as tars:
        assert not isinstance(tars["n1"], io.BytesIO)
        with tarfile.open(fileobj=tars["n1"], mode="r|") as archive:
            assert [m.name for m in archive] == [*(e.path for e in everything), workdir.MANIFEST]


def test_a_sync_renames_its_files_into_place_one_mv_per_directory(tmp_path: Path) -> None:
    """One mv per file cost a first sync of 30000 small files 55 s on three sandbox
    nodes, all of it in forks."""
    source = tmp_path / "project"
    _tree(source, {f"{d}/f{i}.py": str(i) for d in ("a", "a/b") for i in range(40)})
    local = workdir.local_files(source)
    with workdir.tar_stream(source, tuple(local.values()), sorted(local)) as stream:
        tar = stream.read()
    shims = tmp_path / "bin"
    shims.mkdir()
    calls = tmp_path / "mv-calls"
    mv = shutil.which("mv")
    (shims / "mv").write_text(f"#!/bin/sh\necho >> {calls}\nexec {mv} \"$@\"\n")
    (shims / "mv").chmod(0o755)
    target = tmp_path / "node"
    target.mkdir()
    applied = subprocess.run(["sh", "-c", workdir.apply_command(str(target), (), "n1")],
                             input=tar, capture_output=True, timeout=60, check=False,
                             env={**os.environ, "PATH": f"{shims}:{os.environ['PATH']}"})
    assert applied.returncode == 0, applied.stderr
    assert (target / "a/b/f39.py").read_text() == "39"
    assert len(calls.read_text().splitlines()) == 3  # the top (its manifest), a, a/b


def test_files_deleted_here_go_in_one_rm_and_the_directories_they_empty_too(
        tmp_path: Path) -> None:
    """As rsync --delete: a package removed here leaves no empty directory on the nodes
    (it would still import, as a namespace package). A directory that holds the job's
    own files, or gets files in the same sync, stays."""
    import shlex

    from gpucluster.remote.local import LocalConnection

    source, target = tmp_path / "project", tmp_path / "node"
    _tree(source, {"models/a.py": "a", "models/sub/b.py": "b", "keep/c.py": "c",
                   "moved/x.py": "x", **{f"many/f{i}.py": "" for i in range(30)}})
    workdir.sync(LocalConnection("here"), source, workdir.local_files(source),
                 shlex.quote(str(target)))
    (target / "keep/job-output.txt").write_text("the job's own")
    shutil.rmtree(source / "models")
    shutil.rmtree(source / "many")
    (source / "keep/c.py").unlink()
    (source / "moved/x.py").rename(source / "moved/y.py")
    shims = tmp_path / "bin"
    shims.mkdir()
    calls = tmp_path / "rm-calls"
    (shims / "rm").write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\n"
                              f"exec {shutil.which('rm')} \"$@\"\n")
    (shims / "rm").chmod(0o755)
    local = workdir.local_files(source)
    plan, _ = workdir.plan_for(LocalConnection("here"), local, shlex.quote(str(target)))
    assert len(plan.delete) == 34
    with workdir.tar_stream(source, plan.send, sorted(local)) as tar:
        applied = subprocess.run(
            ["sh", "-c", workdir.apply_command(shlex.quote(str(target)), plan.delete, "n1")],
            stdin=tar, capture_output=True, timeout=60, check=False,
            env={**os.environ, "PATH": f"{shims}:{os.environ['PATH']}"})
    assert applied.returncode == 0, applied.stderr
    assert sorted(p.name for p in target.iterdir()) == [workdir.MANIFEST, "keep", "moved"]
    assert sorted(p.name for p in (target / "keep").iterdir()) == ["job-output.txt"]
    assert sorted(p.name for p in (target / "moved").iterdir()) == ["y.py"]
    removals = [line for line in calls.read_text().splitlines() if "-- " in line]
    assert len(removals) == 1 and removals[0].count(".py") == 34, removals


def test_symbolic_links_are_sent_as_links_and_never_written_through(tmp_path: Path) -> None:
    """As rsync -a and git do: a link is recreated on the node, pointing where it points
    here (a dataset link resolves to the node's own copy), a dangling one included; a
    link to a directory is not followed, and a file sent later never lands through a
    link the node still has from an earlier sync."""
    import shlex

    from gpucluster.remote.local import LocalConnection

    source, outside = tmp_path / "project", tmp_path / "datasets"
    _tree(source, {"train.py": "print(1)", "configs/base.yaml": "lr: 1"})
    _tree(outside, {"imagenet/train.bin": "dataset"})
    (source / "config.yaml").symlink_to("configs/base.yaml")
    (source / "data").symlink_to(outside / "imagenet")
    (source / "pending").symlink_to("/nonexistent/yet/")  # kept as written, slash included
    target = tmp_path / "node" / "project"

    def synced() -> workdir.SyncResult:
        return workdir.sync(LocalConnection("here"), source, workdir.local_files(source),
                            shlex.quote(str(target)))

    (source / ".gpuclusterignore").write_text("pending/\n")  # a directory's rule: not a link's
    first = synced()
    assert first.sent == 6 and first.bytes_sent < 100  # no dataset copied
    links = {p.name: os.readlink(p)  # noqa: PTH115 (as written)
             for p in target.iterdir() if p.is_symlink()}
    assert links == {"config.yaml": "configs/base.yaml", "data": str(outside / "imagenet"),
                     "pending": "/nonexistent/yet/"}
    again = synced()
    assert (again.sent, again.unchanged) == (0, 6)
    # The link becomes a directory of the work dir's own: its file lands in the node's
    # copy, never in the dataset the old link pointed at.
    (source / "data").unlink()
    _tree(source, {"data/train.bin": "mine"})

    def two_nodes_sharing_the_dir() -> tuple[str, ...]:
        """Every node plans from the listing before any applies: the second finds done
        what its plan removes."""
        local = workdir.local_files(source)
        plan, _ = workdir.plan_for(LocalConnection("here"), local, shlex.quote(str(target)))
        for node in ("n1", "n2"):
            with workdir.tar_stream(source, plan.send, sorted(local)) as tar:
                applied = LocalConnection("here").run(
                    workdir.apply_command(shlex.quote(str(target)), plan.delete, node),
                    timeout=30, stdin=tar)
            assert applied.ok, (node, applied.stderr)
        return plan.delete

    assert two_nodes_sharing_the_dir() == ("data",)  # n2 finds a directory there
    assert (target / "data").is_dir() and not (target / "data").is_symlink()
    assert (target / "data/train.bin").read_text() == "mine"
    assert (outside / "imagenet/train.bin").read_text() == "dataset"
    # And back: a link where a file was, and where a directory of sent files was; n2's
    # removal of data/train.bin must not go through n1's new link into the dataset.
    (source / "train.py").unlink()
    (source / "train.py").symlink_to("configs/base.yaml")
    shutil.rmtree(source / "data")
    (source / "data").symlink_to(outside / "imagenet")
    assert two_nodes_sharing_the_dir() == ("data/train.bin",)
    assert (outside / "imagenet/train.bin").read_text() == "dataset"
    assert str((target / "train.py").readlink()) == "configs/base.yaml"
    assert str((target / "data").readlink()) == str(outside / "imagenet")
    # A link to a directory pointed elsewhere is replaced, never moved into the directory.
    (source / "data").unlink()
    (source / "data").symlink_to(outside / "imagenet-v2")
    synced()
    assert str((target / "data").readlink()) == str(outside / "imagenet-v2")
    assert sorted(p.name for p in (outside / "imagenet").iterdir()) == ["train.bin"]


def test_nodes_syncing_into_one_shared_code_dir_never_expose_a_partial_file(
        tmp_path: Path) -> None:
    """A work dir on NFS: every node unpacks the same files into one code dir at once.
    A reader (a rank that already started, another node's listing) must only ever see
    the old file or the whole new one, and no node's unpack may fail."""
    import shlex
    import threading

    source = tmp_path / "project"
    _tree(source, {"train.py": "print(1)", "data/big.bin": ""})
    big = os.urandom(1 << 20) * 24
    (source / "data/big.bin").write_bytes(big)
    local = workdir.local_files(source)
    with workdir.tar_stream(source, tuple(local.values()), sorted(local)) as stream:
        tar = stream.read()
    shared = tmp_path / "shared" / "project"
    shared.mkdir(parents=True)
    (shared / "data").mkdir()
    (shared / "data/big.bin").write_bytes(b"old")
    seen: set[int] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            with contextlib.suppress(OSError):
                seen.add((shared / "data/big.bin").stat().st_size)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        nodes = [subprocess.Popen(
            ["sh", "-c", workdir.apply_command(shlex.quote(str(shared)), (), node)],
            stdin=subprocess.PIPE, stderr=subprocess.PIPE) for node in ("n1", "n2", "n3")]
        errors = [node.communicate(tar, timeout=60)[1] for node in nodes]
    finally:
        done.set()
        watcher.join()
    assert [node.returncode for node in nodes] == [0, 0, 0], errors
    assert seen <= {3, len(big)}, sorted(seen)
    assert (shared / "data/big.bin").read_bytes() == big
    assert sorted(p.name for p in shared.iterdir()) == [workdir.MANIFEST, "data", "train.py"]


def test_recovery_classifies_what_ended_an_attempt(tmp_path: Path) -> None:
    from gpucluster.launch.attempt_report import classify, signature
    from gpucluster.launch.model import FirstFailure, JobOutcome, NodeState

    record = JobRecord("20260101-000000-abcd", "t.py", [], ["n1", "n2"], "/c", "/j", 0.0,
                       {"n1": 1, "n2": 1})
    lost = NodeState("n2", "unreachable", None, "connection lost while running")
    outcome = JobOutcome(record, {"n2": lost}, FirstFailure("n2", lost, None, None, ()))
    assert classify(outcome) == ("node lost", "n2: unreachable (connection lost while "
                                              "running)")
    error = NodeState("n1", "exited", 1)
    failing = FirstFailure("n1", error, 1, 1, ("torchrun noise",),
                           rank_tail=("Traceback", "[rank1]: RuntimeError: staged failure",
                                      "rank 1/2 ready", ""))
    outcome = JobOutcome(record, {"n1": error}, failing)
    assert classify(outcome) == ("worker error", "rank 1 on n1: RuntimeError: staged failure")
    assert signature(outcome) == (1, "RuntimeError: staged failure")
    # A rank killed by a signal (the OOM killer) printed no error: its last line was
    # "ready", which the report gave as the cause
    killed = FirstFailure("n1", error, 1, 1, (), worker_exit=-9, rank_tail=("rank 1/2 ready",))
    assert classify(JobOutcome(record, {"n1": error}, killed)) == (
        "worker error", "rank 1 on n1: killed by signal 9 (SIGKILL); its last line: "
                        "rank 1/2 ready")
    # Its torchrun killed, its workers orphaned: the node's last line ("Killed") is not
    # the cause
    agent = NodeState("n2", "leftover", 137)
    orphaned = JobOutcome(record, {"n2": agent}, FirstFailure("n2", agent, None, 137,
                                                              ("Killed",)))
    assert classify(orphaned) == ("worker error", "n2: torchrun was killed by signal 9 "
                                  "(SIGKILL) while processes of the job still ran there")
    assert classify(JobOutcome(record, {}, hang="no rank made progress for 12s")) == (
        "hang", "no rank made progress for 12s")
    assert classify(JobOutcome(record, {"n1": NodeState("n1", "exited", 0)})) == (
        "succeeded", "")
    assert classify(JobOutcome(record, {}, interrupted=True))[0] == "interrupted"


def test_recovery_reports_the_step_each_attempt_resumed_at() -> None:
    from gpucluster.launch.attempt_report import AttemptReport

    failed = AttemptReport(1, "j1", ("n1",), "node lost", "", 30.0, first_step=1,
                           last_step=57, first_progress_at=100.0, last_progress_at=130.0)
    resumed = AttemptReport(2, "j2", ("n1",), "succeeded", "", 20.0, first_step=41,
                            last_step=100, first_progress_at=149.5, last_progress_at=170.0)
    assert resumed.resumed(failed) == (41, 17, 19.5)  # steps 41..57 done again
    touch_only = AttemptReport(2, "j2", ("n1",), "succeeded", "", 20.0,
                               first_progress_at=149.5)
    assert touch_only.resumed(failed) == (None, None, 19.5)


def test_a_quarantined_node_out_of_reach_is_named_with_the_stop_of_its_attempt() -> None:
    """A network cut left attempt 1's ranks running on node2, said nowhere but `jobs`."""
    import io

    from rich.console import Console

    from gpucluster.cli.views.recovery import print_recovery
    from gpucluster.launch.attempt_report import AttemptReport
    from gpucluster.launch.recover import RecoveryResult

    cut = AttemptReport(1, "j1", ("node1", "node2", "node3"), "node lost", "node2: ...",
                        30.0, quarantined={"node2": "ssh: unreachable", "node3": "xid: 79"},
                        out_of_reach=("node2",))
    out = io.StringIO()
    print_recovery(Console(file=out, width=200), RecoveryResult("j1", [cut]))
    assert out.getvalue().splitlines()[-1] == (
        "    job j1 may still run on node2, out of reach: gpucluster stop j1 ends it there "
        "once it answers")
    stopped = io.StringIO()  # node3 answered: stopped there, nothing to say
    print_recovery(Console(file=stopped, width=200), RecoveryResult("j1", [
        dataclasses.replace(cut, out_of_reach=())]))
    assert "may still run" not in stopped.getvalue()


def test_recovery_bounds_nccl_waits() -> None:
    from gpucluster.launch.recover import COLLECTIVE_TIMEOUT, RecoveryPolicy, watchdog_env

    env = watchdog_env(RecoveryPolicy(hang_timeout_s=10))
    assert env[COLLECTIVE_TIMEOUT] == env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "60"
    assert watchdog_env(RecoveryPolicy(hang_timeout_s=300))[COLLECTIVE_TIMEOUT] == "600"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"


def test_prune_ages_read_as_a_user_writes_them() -> None:
    from gpucluster.launch.prune import age_words, parse_age

    assert [parse_age(t) for t in ("7d", "12h", "30m", "90s", "0", "1.5d", "2")] == \
        [7 * 86400, 12 * 3600, 1800, 90, 0, 1.5 * 86400, 2 * 86400]
    assert [parse_age(t) for t in ("2w", "1d12h", "2h30m", "1h1h")] == \
        [14 * 86400, 36 * 3600, 9000, 7200]  # weeks, and sums as Go's durations write them
    assert [age_words(t) for t in ("7", "7d", "0", " 2h30m")] == ["7d", "7d", "0d", "2h30m"]
    for bad in ("7x", "-1d", "", "d", "2h 30m", "h2", "1d-2h"):
        with pytest.raises(GpuclusterError, match="not an age"):
            parse_age(bad)


def test_jobs_names_a_node_the_inventory_no_longer_lists() -> None:
    """It used to show `?: node3`."""
    import io

    from rich.console import Console

    from gpucluster.cli.views.launch import print_jobs
    from gpucluster.launch.model import NodeState

    record = JobRecord("20260101-000000-abcd", "t.py", [], ["n1", "n2", "n3"], "/c", "/j",
                       0.0, {"n1": 1, "n2": 1, "n3": 1})
    console = Console(width=200, record=True, file=io.StringIO())
    print_jobs(console, [record], {record.id: {n: NodeState(n, "stopped", None)
                                               for n in ("n1", "n2")}}, {}, {})
    assert "stopped: n[1-2], not in this inventory: n3" in console.export_text()


def test_jobs_says_how_long_a_running_job_has_been_quiet(tmp_path: Path) -> None:
    """A hang is quiet: no output, no heartbeat. The node's state script says for how
    long, by the node's clock, from the newer of the job's node.log and heartbeat file;
    `jobs` says so once it is a minute, with how to see where each rank was."""
    import io
    import time

    from rich.console import Console

    from gpucluster.cli.views.launch import jobs_payload, print_jobs
    from gpucluster.launch.control import states
    from gpucluster.remote.ssh import SshOptions

    with local_job(tmp_path) as (loaded, record):
        def state() -> NodeState:
            return states(Session(loaded, SshOptions(tmp_path / "known_hosts")), loaded,
                          [record])[record.id]["node1"]

        job = tmp_path / "jobs" / record.id / "node1"
        assert state().quiet_s in (0, 1, 2, 3)  # node.log made as it started
        os.utime(job / "node.log", (time.time() - 300, time.time() - 300))
        (job / "heartbeat").touch()
        os.utime(job / "heartbeat", (time.time() - 90, time.time() - 90))
        quiet = state()
        assert quiet.state == "running" and quiet.quiet_s in (90, 91, 92), quiet
        console = Console(width=300, record=True, file=io.StringIO())
        print_jobs(console, [record], {record.id: {"node1": quiet}}, {}, {})
        assert f"quiet for 1m: no output or heartbeat on any node (a hang? gpucluster " \
               f"stacks {record.id} says where each rank is; stop --stacks ends it so)" in \
               console.export_text()
        assert jobs_payload([record], {record.id: {"node1": quiet}}, {}, {})["jobs"][0][
            "quiet_s"] == quiet.quiet_s
        # Under a recovery supervisor, whose --hang-timeout ends a hang: no hint.
        console = Console(width=300, record=True, file=io.StringIO())
        print_jobs(console, [record], {record.id: {"node1": quiet}}, {record.id: 4242}, {})
        assert "no output or heartbeat on any node\n" in console.export_text().replace(
            " │\n", "\n").replace("  ", ""), console.export_text()


def test_jobs_in_80_columns_shows_a_recovery_runs_whole_id() -> None:
    """It was cut to `20261206-061848…`: the id `jobs` names the run by."""
    import io

    from rich.console import Console

    from gpucluster.cli.views.launch import print_jobs
    from gpucluster.launch.model import NodeState

    record = JobRecord("20261206-061927-3054", "train.py", ["--epochs", "10", "--step-delay",
                                                            "0.05"], ["node1", "node2"],
                       "/c", "/j", 0.0, {"node1": 2, "node2": 2}, attempt=2,
                       run="20261206-061848-cd8a")
    console = Console(width=80, record=True, file=io.StringIO())
    print_jobs(console, [record], {record.id: {n: NodeState(n, "exited", 0)
                                               for n in record.hosts}}, {}, {})
    shown = console.export_text()
    assert "…" not in shown and "20261206-061848" in shown, shown
    assert "cd8a" in shown.replace("│", " ").split("20261206-061848")[1], shown


def test_jobs_shows_the_first_failure_a_follow_named(tmp_path: Path) -> None:
    """`jobs` said `exited 1: node2` and no more: why took a `logs JOB`. The line a
    follow of the ended job noted is shown (and in --json), no log fetched; one that
    never ended in a follow has none."""
    import io

    from rich.console import Console

    from gpucluster.cli.views.launch import jobs_payload, print_jobs
    from gpucluster.launch.failure import in_a_line
    from gpucluster.launch.known_causes import known_cause
    from gpucluster.launch.model import FirstFailure, NodeState

    store = JobStore(tmp_path)
    failed, other = (JobRecord(job, "t.py", [], ["n1", "n2"], "/c", "/j", 0.0,
                               {"n1": 1, "n2": 1}) for job in
                     ("20261206-100000-aaaa", "20261206-100100-bbbb"))
    for record in (failed, other):
        store.save(record)
    words = "RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"
    state = NodeState("n2", "exited", 1)
    failure = FirstFailure("n2", state, 1, 1, (), rank_tail=(f"[rank1]: {words}",),
                           cause=known_cause([words], "n2"))
    store.note_failure(failed.id, in_a_line(failure))
    noted = {r.id: n for r in (failed, other) if (n := store.noted_failure(r.id))}
    assert noted == {failed.id: "rank 1 on n2: a disk the job wrote to was full (torch.save "
                                "says 'unexpected pos')"}
    # Without a known cause, the rank's last error line says it.
    plain = dataclasses.replace(failure, cause=None)
    assert in_a_line(plain) == f"rank 1 on n2: {words}"
    # Without an error line (a sys.exit), how the worker ended, else how the node did.
    silent = dataclasses.replace(plain, rank_tail=("epoch 3",))
    assert in_a_line(dataclasses.replace(silent, worker_exit=7)) == \
        "rank 1 on n2: worker exit code 7"
    assert in_a_line(dataclasses.replace(silent, worker_exit=-9)) == \
        "rank 1 on n2: worker killed by signal 9 (SIGKILL)"
    assert in_a_line(dataclasses.replace(silent, rank=None)) == "n2: exited 1"
    console = Console(width=200, record=True, file=io.StringIO())
    table = {r.id: {n: state for n in r.hosts} for r in (failed, other)}
    print_jobs(console, [failed, other], table, {}, noted)
    shown = console.export_text()
    assert shown.count("first failure: ") == 1 and "first failure: rank 1 on n2: a disk" in \
        shown, shown
    payload = jobs_payload([failed, other], table, {}, noted)["jobs"]
    assert [j["first_failure"] for j in payload] == [noted[failed.id], None]


def test_jobs_says_a_job_failed_on_a_node_while_the_others_run_on() -> None:
    """A detached job whose rank on n3 raised: n[1-2]'s torchrun waited on (its exit
    barrier), and `jobs` showed `running: n[1-2], exited 1: n3` as if all were well."""
    import io

    from rich.console import Console

    from gpucluster.cli.views.launch import print_jobs
    from gpucluster.launch.model import NodeState

    record = JobRecord("20261206-120000-abcd", "t.py", [], ["n1", "n2", "n3"], "/c", "/j",
                       0.0, {"n1": 1, "n2": 1, "n3": 1})

    def shown(states: dict[str, NodeState], supervisor: int | None = None) -> str:
        console = Console(width=300, record=True, file=io.StringIO())
        print_jobs(console, [record], {record.id: states}, {record.id: supervisor}, {})
        return " ".join(console.export_text().replace("│", " ").split())

    half = {"n1": NodeState("n1", "running"), "n2": NodeState("n2", "running"),
            "n3": NodeState("n3", "exited", 1)}
    assert (f"failed on n3, still running on n[1-2]: gpucluster logs {record.id} says why; "
            f"gpucluster stop {record.id} ends it") in shown(half)
    assert "failed on" not in shown(half, supervisor=4242)  # recovery's to deal with
    for calm in ({**half, "n3": NodeState("n3", "exited", 0)},  # finished its part
                 {**half, "n3": NodeState("n3", "unreachable")}):  # no news of it
        assert "failed on" not in shown(calm), shown(calm)


def test_jobs_says_which_nodes_a_failed_node_could_not_stop_and_why(tmp_path: Path) -> None:
    """node1's torchrun failed and its stop of the others (stop_peers.sh) reached no one
    (no SSH mesh): its report, read from the node with its state, names them and why
    under the job's states, and in --json."""
    import io
    import shlex

    from rich.console import Console

    from gpucluster.cli.views.launch import jobs_payload, print_jobs
    from gpucluster.launch.control import states
    from gpucluster.remote.ssh import SshOptions

    inventory = tmp_path / "c.yaml"
    inventory.write_text("hosts:\n  - {name: node1, address: 127.0.0.1, connection: local}\n"
                         "  - {name: node-2, address: 127.0.0.2}\n  - {name: node3, address: "
                         "127.0.0.3}\n")
    loaded = inventory_module.load(inventory)
    record = dataclasses.replace(job_record(), hosts=["node1"], nproc_per_node={"node1": 1},
                                 jobs_dir=shlex.quote(str(tmp_path / "node-jobs")))
    job = tmp_path / "node-jobs" / record.id / "node1"
    job.mkdir(parents=True)
    (job / "exit_code").write_text("1 1700000000.0\n")
    hint = f"(gpucluster stop {record.id} ends it there)"
    (job / "stop-peers.log").write_text(
        f"torchrun exited 1 on node1: stopping job {record.id} on node-2,node3\n"
        f"node-2: not stopped: Host key verification failed. {hint}\n"
        f"node3: not stopped: Host key verification failed. {hint}\n")
    found = states(Session(loaded.restricted_to([loaded.host("node1")]),
                           SshOptions(tmp_path / "known_hosts")), loaded, [record])
    node1 = found[record.id]["node1"]
    assert (node1.state, node1.exit_code) == ("exited", 1)
    assert node1.peers_left == (("node-2", "Host key verification failed."),
                                ("node3", "Host key verification failed."))
    table = {record.id: {"node1": node1, "node-2": NodeState("node-2", "running"),
                         "node3": NodeState("node3", "running")}}
    wide = dataclasses.replace(record, hosts=["node1", "node-2", "node3"])
    console = Console(width=400, record=True, file=io.StringIO())
    print_jobs(console, [wide], table, {record.id: None}, {})
    shown = " ".join(console.export_text().replace("│", " ").split())
    assert (f"gpucluster stop {record.id} ends it; node1 could not stop it on node-2,node3 "
            f"(Host key verification failed.)") in shown, shown
    payload = jobs_payload([wide], table, {record.id: None}, {})
    assert payload["jobs"][0]["nodes"]["node1"]["peers_not_stopped"] == {
        "node-2": "Host key verification failed.", "node3": "Host key verification failed."}


def test_jobs_reads_a_failure_only_of_a_job_ended_everywhere_and_lists_on_without_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node still running, or not answering, may tell another story: no read. A read
    that fails (the controller's disk, a node gone mid-copy) leaves the listing as it
    was, with nothing noted."""
    from gpucluster.errors import GpuclusterError
    from gpucluster.launch import unread_failures
    from gpucluster.launch.model import NodeState

    store = JobStore(tmp_path)
    record = JobRecord("20261206-130000-abcd", "t.py", [], ["n1", "n2"], "/c", "/j", 0.0,
                       {"n1": 1, "n2": 1})
    store.save(record)
    ended = {"n1": NodeState("n1", "stopped"), "n2": NodeState("n2", "exited", 1)}
    assert unread_failures.failed_unread(store, record, ended)
    assert unread_failures.failed_unread(store, record, {**ended, "n1": NodeState("n1", "lost")})
    for unsure in ({**ended, "n1": NodeState("n1", "running")},
                   {**ended, "n1": NodeState("n1", "unreachable")},
                   {"n2": ended["n2"]},  # n1 not in this inventory
                   {**ended, "n2": NodeState("n2", "exited", 0)}):  # no failure
        assert not unread_failures.failed_unread(store, record, unsure), unsure
    asked: list[list[str]] = []

    def failing_follow(*_: object, nodes: list[str], **__: object) -> None:
        asked.append(nodes)
        raise GpuclusterError("n2: connection lost")

    monkeypatch.setattr(unread_failures, "follow", failing_follow)
    unread_failures.note_unread(None, None, store, [record], {record.id: ended})  # type: ignore[arg-type]
    assert asked == [["n2"]] and store.noted_failure(record.id) is None
    store.note_failure(record.id, "rank 1 on n2: RuntimeError: x")
    assert not unread_failures.failed_unread(store, record, ended)  # read once


def test_logs_of_nodes_a_job_did_not_run_on_is_one_line_before_any_connection(
        tmp_path: Path) -> None:
    import subprocess
    import sys

    inventory = tmp_path / "c.yaml"
    inventory.write_text("hosts:\n  - {name: 'n[1-9]', address: '10.0.0.[1-9]'}\n")
    job_id = new_job_id(1_800_000_000)
    JobStore(tmp_path / ".gpucluster").save(JobRecord(
        job_id, "train.py", [], ["n1", "n2"], "/srv/p", "/srv/jobs", 0.0, {"n1": 1, "n2": 1}))
    result = subprocess.run([sys.executable, "-m", "gpucluster", "logs", "-i", str(inventory),
                             "last", "-w", "n[2-5]"], check=False, capture_output=True,
                            text=True)
    assert (result.returncode, result.stderr) == (2, (  # was a ValueError traceback
        f"gpucluster: error: job {job_id} did not run on n[3-5] (fix: --hosts with one of "
        f"n[1-2])\n"))


def test_recovery_options_are_refused_where_they_would_be_ignored(tmp_path: Path) -> None:
    from gpucluster.cli.recovery_flow import policy
    from gpucluster.launch.recover import RecoveryPolicy

    path = tmp_path / "c.yaml"
    path.write_text("hosts:\n  - {name: 'n[1-3]', address: '10.0.0.[1-3]'}\n"
                    "  - {name: s1, address: 10.0.0.9, spare: true}\n")
    loaded = inventory_module.load(path)
    assert policy(loaded, False, 5.0, None, None, None, None) is None
    with pytest.raises(GpuclusterError, match=r"^--min-nodes, --hang-timeout: only with "
                                              r"--recover \(fix: add --recover, or drop them\)"):
        policy(loaded, False, 5.0, 2, None, 60.0, None)
    # The first attempt has the three non-spares: a fourth node could only be a spare.
    with pytest.raises(GpuclusterError, match=r"^--min-nodes 4: the first attempt has 3 "
                                              r"nodes, n\[1-3\] .* \(fix: --min-nodes 3 or"):
        policy(loaded, True, 5.0, 4, None, None, None)
    assert policy(loaded, True, 5.0, None, None, None, None) == RecoveryPolicy(grace_s=5.0)
    assert policy(loaded, True, 5.0, 3, 0, 60.0, 20.0) == RecoveryPolicy(3, 0, 60.0, 20.0, 5.0)


def test_prune_counts_checkpoints_by_their_files_not_empty_directories(tmp_path: Path) -> None:
    from gpucluster.templating import render

    jobs = tmp_path / "jobs"
    for job in ("a", "b", "c"):
        (jobs / job / "n1").mkdir(parents=True)
    (tmp_path / "ckpt-a").mkdir()  # the script never wrote a checkpoint
    (tmp_path / "ckpt-b" / "epoch-3").mkdir(parents=True)
    (tmp_path / "ckpt-b" / "epoch-3" / "model.pt").write_bytes(os.urandom(64 * 1024))
    script = render("launch/prune.sh.j2", node="n1", remove=False, jobs=[
        {"id": job, "jobs_dir": str(jobs), "checkpoints": str(tmp_path / f"ckpt-{job}"),
         "remove_checkpoints": False} for job in ("a", "b", "c")])
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
    sizes = {f[2]: f[4] for f in (line.split() for line in done.stdout.splitlines())}
    assert sizes["a"] == "0" and int(sizes["b"]) >= 64 and sizes["c"] == "-", done.stdout


def test_a_job_is_never_asked_for_on_another_clusters_machine_of_the_same_name(
        tmp_path: Path) -> None:
    """Two clusters' inventories side by side share .gpucluster/: `stop -i b.yaml` of a's
    job asked b's n1, found nothing there and called the job stopped."""
    from gpucluster.launch.control import hosts_of

    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("hosts:\n  - {name: 'n[1-2]', address: '10.0.0.[1-2]'}\n")
    b.write_text("hosts:\n  - {name: 'n[1-2]', address: '10.0.1.[1-2]', port: 2222}\n")
    record = JobRecord("20261202-120000-abcd", "t.py", [], ["n1", "n2"], "/c", "/j", 0.0,
                       {"n1": 1, "n2": 1}, inventory=str(a),
                       endpoints={"n1": "10.0.0.1", "n2": "10.0.0.2"})
    with pytest.raises(GpuclusterError) as caught:
        hosts_of(inventory_module.load(b), record)
    assert str(caught.value) == (
        "job 20261202-120000-abcd cannot be reached through this inventory: n1 ran it at "
        "10.0.0.1, b.yaml has it at 10.0.1.1:2222; n2 ran it at 10.0.0.2, b.yaml has it at "
        f"10.0.1.2:2222 (fix: -i {a}, the inventory it was started with)")
    assert [h.address for h in hosts_of(inventory_module.load(a), record)] == [
        "10.0.0.1", "10.0.0.2"]
    # Its own inventory, a node re-addressed since: taken at its word.
    a.write_text("hosts:\n  - {name: n1, address: 10.0.0.1}\n  - {name: n2, address: 10.9.9.9}\n")
    assert hosts_of(inventory_module.load(a), record)[1].address == "10.9.9.9"
    v6 = tmp_path / "v6.yaml"
    v6.write_text("hosts:\n  - {name: n1, address: 'fd00::1', port: 2222}\n")
    # The port stays apart from an IPv6 address.
    assert inventory_module.load(v6).hosts[0].endpoint == "[fd00::1]:2222"
    # A record from before the fields, and one with a field from a newer gpucluster.
    old = dataclasses.replace(record, inventory="", endpoints={})
    assert len(hosts_of(inventory_module.load(b), old)) == 2
    store = JobStore(tmp_path / ".gpucluster")
    (store.save(record) / "job.json").write_text(json.dumps(
        {**dataclasses.asdict(record), "from_the_future": 1}))
    assert store.load(record.id) == record


def test_logs_of_a_job_on_a_node_no_longer_listed_names_the_others_and_the_copy(
        tmp_path: Path) -> None:
    import subprocess
    import sys

    inventory = tmp_path / "c.yaml"  # the cluster shrank: n3 is gone
    inventory.write_text("hosts:\n  - {name: 'n[1-2]', address: '10.0.0.[1-2]'}\n")
    job_id = new_job_id(1_800_000_000)
    store = JobStore(tmp_path / ".gpucluster")
    store.save(JobRecord(job_id, "train.py", [], ["n1", "n2", "n3"], "/srv/p", "/srv/jobs",
                         0.0, {"n1": 1, "n2": 1, "n3": 1}))
    store.node_log(job_id, "n3").write_text("[0]:epoch 1\n")
    result = subprocess.run([sys.executable, "-m", "gpucluster", "logs", "-i", str(inventory),
                             "last"], check=False, capture_output=True, text=True)
    assert (result.returncode, result.stderr) == (2, (
        f"gpucluster: error: job {job_id} cannot be read through this inventory: c.yaml "
        f"does not list n3 (fix: the inventory the job was started with, or -w n[1-2] for "
        f"the others; the "
        f"copy kept here: {store.node_log(job_id, 'n3')})\n"))


def _ended_job(tmp_path: Path, log: bytes) -> JobRecord:
    """A job of node1 that has ended (exit code 0), whose node.log is `log`."""
    import shlex

    record = dataclasses.replace(job_record(), jobs_dir=shlex.quote(str(tmp_path)))
    job = tmp_path / record.id / "node1"
    job.mkdir(parents=True)
    (job / "node.log").write_bytes(log)
    (job / "exit_code").write_text("0 1700000000.0\n")
    (job / "leader.pid").write_text("999999999\n")  # no such process
    return record


@pytest.mark.parametrize("follow", [False, True])
def test_a_log_ending_inside_a_line_keeps_the_state_on_a_line_of_its_own(
        tmp_path: Path, follow: bool) -> None:
    """A progress bar's \\r updates leave a running job's log inside a line for minutes:
    the state was glued to it, so `logs` showed the report's lines and said `lost`."""
    from gpucluster import reports
    from gpucluster.remote.local import LocalConnection

    record = _ended_job(tmp_path, b"[0]:epoch 1\n[0]:progress 3/10\r[0]:progress 4/10")
    result = LocalConnection("here").run(
        node_scripts.follow_script(record, "node1", follow=follow), timeout=15)
    assert result.stdout.startswith("[0]:epoch 1\n[0]:progress 3/10\r[0]:progress 4/10\n@@")
    assert reports.by_kind(result.stdout)["state"] == ["exited 0 1700000000.0"]


@pytest.mark.parametrize("seed", range(6))
def test_the_last_lines_and_the_offset_after_them_match_the_whole_log(
        tmp_path: Path, seed: int) -> None:
    """`logs -n` reads a window of the log's end, grown until it holds the lines: the
    lines are the whole log's last ones, long lines included; `logs -f -n` follows from
    the offset, which is past them, or at an unfinished last line (sent whole then)."""
    import random

    from gpucluster.launch.log_tail import parse_tail
    from gpucluster.remote.local import LocalConnection

    chance = random.Random(seed)
    lines = [f"[{chance.randrange(4)}]:" + "x" * chance.choice([0, 5, 300, 90000])
             for _ in range(chance.randrange(0, 40))]
    text = "\n".join(lines) + ("\n" if lines and chance.random() < 0.5 else "")
    record = _ended_job(tmp_path, text.encode())
    here = LocalConnection("here")
    for last in (0, 1, 3, 50):
        script = node_scripts.follow_script(record, "node1", follow=False, last_lines=last)
        tail = parse_tail(record, "node1", here.run(script, timeout=15).stdout)
        assert tail.state.state == "exited"
        expected = text.splitlines()[-last:] if last else []
        assert [f"[{line.rank}]:{line.text}" for line in tail.lines] == expected
        unfinished = bool(text) and not text.endswith("\n")
        assert tail.last_unfinished is unfinished
        assert tail.resume_at == len(text) - (len(text.splitlines()[-1]) if unfinished else 0)
        # What a follow from there sends: the rest of the log, and no stamps.
        rest = here.run(node_scripts.follow_script(record, "node1", follow=True,
                                                   from_byte=tail.resume_at), timeout=15)
        sent = rest.stdout.split("@@gpc state", 1)[0]
        assert sent == text[tail.resume_at:] + ("\n" if unfinished else "")
        assert rest.stdout.rstrip().endswith("@@gpc times")


def test_the_fewest_nodes_are_set_aside_to_part_every_pair_that_loses_full_size_packets(
) -> None:
    """path-mtu FAILs both nodes of a pair; either going mends it."""
    from gpucluster.doctor.model import CheckResult, Status
    from gpucluster.launch.node_health import fewest_to_part

    def lossy(pairs: dict[str, list[str]]) -> dict[str, CheckResult]:
        return {node: CheckResult("path-mtu", node, Status.FAIL, "lost",
                                  details={"stalled_from": dict.fromkeys(sources, 9000)})
                for node, sources in pairs.items()}

    order = ["n1", "n2", "n3", "n4", "n5"]
    everyone = set(order)
    # Two nodes with jumbo frames: the later goes, the head's side stays.
    assert fewest_to_part(lossy({"n2": ["n3"], "n3": ["n2"]}), (), everyone, order) == ["n3"]
    # One node in a pair with each of three others: it goes alone.
    star = lossy({"n1": ["n4"], "n2": ["n4"], "n3": ["n4"], "n4": ["n1", "n2", "n3"]})
    assert fewest_to_part(star, (), everyone, order) == ["n4"]
    # Three with one another: two go.
    triangle = lossy({"n2": ["n3", "n4"], "n3": ["n2", "n4"], "n4": ["n2", "n3"]})
    assert fewest_to_part(triangle, (), everyone, order) == ["n4", "n3"]
    # A node going for another reason mends its pairs already.
    assert fewest_to_part(triangle, ["n4"], everyone, order) == ["n3"]
    # Only judged nodes go (a spare tried beside the nodes it would join).
    assert fewest_to_part(star, (), {"n4"}, order) == ["n4"]
    assert fewest_to_part(lossy({"n1": ["n2"]}), (), {"n5"}, order) == []


@pytest.mark.parametrize("ending", ["", "[1]:progress 4/10", "[1]:" + "x" * 70000])
def test_a_live_follow_marks_where_the_log_it_began_with_has_come(
        tmp_path: Path, ending: str) -> None:
    """The controller's copy written again replaces the one before at that mark (a
    follow cut short before it leaves the one before whole). A line the log ends inside
    comes after the mark, whole; one longer than the window looked at leaves the mark
    out (the copy then replaces the one before at its end)."""
    from gpucluster.remote.local import LocalConnection

    text = "[0]:epoch 1\n[0]:epoch 2\n" + ending
    record = _ended_job(tmp_path, text.encode())
    job = tmp_path / record.id / "node1"
    leader = subprocess.Popen(["sleep", "1.5"], env={
        **os.environ, "GPUCLUSTER_JOB": record.marker("node1")})
    try:
        (job / "leader.pid").write_text(f"{leader.pid}\n")
        (job / "exit_code").unlink()
        result = LocalConnection("here").run(
            node_scripts.follow_script(record, "node1", follow=True), timeout=15)
    finally:
        leader.kill()
        leader.wait()
    sent = result.stdout.split("@@gpc state", 1)[0]
    unfinished = "\n" if ending else ""
    if len(ending) > 65536:
        assert sent == text + unfinished  # no mark
        return
    mark = len(text) - len(ending)
    assert sent == f"{text[:mark]}@@gpc caught-up\n{text[mark:]}{unfinished}"
