"""The bundle's scrubbing of secrets and its SUMMARY.md, from collected values."""

from __future__ import annotations

import dataclasses
import errno
import shlex
import time
from pathlib import Path

import pytest

from gpucluster.bundle.archive import summary
from gpucluster.bundle.collect import SINFO_HEADING, Collected, NodeBundle, scrub
from gpucluster.doctor.model import CheckResult, Status
from gpucluster.doctor.runner import DoctorReport
from gpucluster.launch.jobs import JobRecord
from gpucluster.launch.model import FirstFailure, JobOutcome, NodeState


def test_secret_looking_assignments_are_masked_wherever_they_were_printed() -> None:
    text = (b'[2]:HF_TOKEN=hf_abc123 ready\n{"wandb_api_key": "k-999", "lr": 0.1}\n'
            b"DB_PASSWORD: hunter2\nPATH=/usr/bin:/bin\n")
    assert scrub(text) == (b'[2]:HF_TOKEN=*** ready\n{"wandb_api_key": "***", "lr": 0.1}\n'
                           b"DB_PASSWORD: ***\nPATH=/usr/bin:/bin\n")
    assert scrub(b"\xff\xfe binary stays") == b"\xff\xfe binary stays"


def test_the_scrub_masks_what_one_plain_regex_over_the_text_masks() -> None:
    """The scrub looks for the words first and tries its pattern only there (the plain
    case-blind regex over every word took 10 s for 100 MB of logs); what it masks must
    be what that regex masks, names split across matches and near misses included."""
    import random
    import re

    plain = re.compile(r"(\b[A-Za-z0-9_]*(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL)"
                       r"[A-Za-z0-9_]*[\"']?\s*[=:]\s*[\"']?)([^\s\"',]+)", re.IGNORECASE)
    pieces = ["KEY", "key", "Token", "_", "=", ":", " ", "\n", '"', "'", "a", "1", ",",
              "SECRET", "passwd", "PassWord", "credentialS", "monkey", "x"]
    generator = random.Random(7)
    for _ in range(5000):
        text = "".join(generator.choice(pieces) for _ in range(generator.randint(1, 12)))
        assert scrub(text.encode()) == plain.sub(lambda m: m.group(1) + "***",
                                                 text).encode(), text


def test_the_summary_names_the_first_failure_the_lost_node_and_differing_fields() -> None:
    record = JobRecord("20261130-120000-abcd", "fails.py", [], ["node1", "node2", "node3"],
                       "/c", "/j", 0.0, {"node1": 2, "node2": 2, "node3": 2})
    exited = NodeState("node2", "exited", 1)
    failure = FirstFailure("node2", exited, 3, 1, (), 1, "2026-11-30_13:00:00",
                           ("Traceback (most recent call last):",
                            "RuntimeError: staged failure on node2"))
    # A stopped torchrun exits 1 itself (TERM): "stopped 1" read as a second failure.
    outcome = JobOutcome(record, {"node2": exited, "node1": NodeState("node1", "stopped", 1)},
                         failure)
    doctor = DoctorReport(("node1", "node2"), ("driver",), (
        CheckResult("driver", "node2", Status.FAIL, "driver 535 differs from 550"),
        CheckResult("xid", "node1", Status.WARN, "1 Xid errors in the kernel log"),
        CheckResult("sudo", "node1", Status.WARN, "sudo asks for a password"),
        CheckResult("sudo", "node2", Status.WARN, "sudo asks for a password")),
        summary={"driver": {"550.54": ["node1"], "535.104": ["node2"]},
                 "torch": {"2.13.0": ["node1", "node2"]}})
    nodes = {"node1": NodeBundle("node1", {"kernel-gpu.txt":
                                           b"NVRM: Xid (PCI:0000:18:00): 79, pid=1\n"}),
             "node2": NodeBundle("node2"),
             "node3": NodeBundle("node3", error="cannot connect: timed out")}
    text = summary(Collected(nodes, doctor, outcome, record, 4.2, failure), Path("inv.yaml"))
    assert "**First failure: node2, rank 3** (exited, exit 1, worker exit 1)." in text
    assert "RuntimeError: staged failure on node2" in text
    assert "States: exited 1 on node2, stopped on node1." in text
    assert "- **node3**: cannot connect: timed out" in text
    assert "- **driver**: `550.54` on node1; `535.104` on node2" in text
    assert "torch" not in text.split("## Fields that differ")[1].split("##")[0]
    assert "- node1: Xid 79 on GPU 0000:18:00" in text
    assert "- node1: doctor `xid`: 1 Xid errors in the kernel log" in text
    assert "- node[1-2] `sudo` WARN: sudo asks for a password\n" in text  # said once
    # Its last traceback far above its last lines (torchrun copied its stdout after it).
    error = ("Traceback (most recent call last):", "RuntimeError: the cause")
    buried = dataclasses.replace(failure, rank_tail=("step 9", "step 10"), rank_error=error)
    text = summary(Collected(nodes, doctor, outcome, record, 4.2, buried), Path("inv.yaml"))
    assert ("Its last traceback (more of its output came after it):\n\n```\n"
            "Traceback (most recent call last):\nRuntimeError: the cause\n```\n\n"
            "Its last lines:\n\n```\nstep 9\nstep 10\n```") in text
    # At the end of its lines: shown once.
    at_end = dataclasses.replace(buried, rank_tail=("step 10", *error))
    text = summary(Collected(nodes, doctor, outcome, record, 4.2, at_end), Path("inv.yaml"))
    assert "Its last traceback:\n" in text and "Its last lines" not in text


def test_a_job_that_ended_well_has_its_nodes_folded_by_state() -> None:
    record = JobRecord("20261130-120000-abcd", "train.py", [], ["node1", "node2", "node3"],
                       "/c", "/j", 0.0, {"node1": 2, "node2": 2, "node3": 2})
    states = {n: NodeState(n, "exited", 0) for n in record.hosts}
    doctor = DoctorReport(tuple(record.hosts), (), ())
    nodes = {n: NodeBundle(n) for n in record.hosts}
    text = summary(Collected(nodes, doctor, JobOutcome(record, states, None), record, 1.0,
                             None), Path("inv.yaml"))
    assert "No node failed. States: exited 0 on node[1-3]." in text


def test_a_running_jobs_own_processes_are_not_listed_as_findings() -> None:
    """A bundle of a running job listed `gpu-processes FAIL: GPUs held by running job X`
    among doctor's findings, X being the job bundled; another job's stay listed."""
    record = JobRecord("20261130-120000-abcd", "train.py", [], ["node1", "node2"],
                       "/c", "/j", 0.0, {"node1": 2, "node2": 2})
    doctor = DoctorReport(("node1", "node2"), (), (
        *(CheckResult("gpu-processes", n, Status.FAIL,
                      f"GPUs held by running job {record.id} (2 processes)")
          for n in ("node1", "node2")),
        CheckResult("jobs", "node1", Status.WARN, f"job {record.id} still running"),
        CheckResult("jobs", "node2", Status.WARN, "job 20261130-090000-ffff still running")))
    states = {n: NodeState(n, "running", None) for n in record.hosts}
    text = summary(Collected({n: NodeBundle(n) for n in record.hosts}, doctor,
                             JobOutcome(record, states, None), record, 1.0, None),
                   Path("inv.yaml"))
    findings = text.split("## Doctor's other findings")[1].split("##")[0]
    assert findings.count("\n- ") == 1 and "20261130-090000-ffff still running" in findings
    assert f"(Left out: node[1-2] `gpu-processes`/`jobs`, which name job {record.id} " \
           f"itself.)" in findings


def test_no_gpu_errors_is_not_claimed_where_the_kernel_log_was_unreadable() -> None:
    """A node user without passwordless sudo cannot read the kernel log: the summary
    said "no Xid ... and doctor's Xid checks passed" of checks that had been skipped."""
    doctor = DoctorReport(("node1", "node2"), ("xid",), (
        CheckResult("xid", "node1", Status.SKIP, "kernel log not readable (dmesg_restrict=1)"),
        CheckResult("xid", "node2", Status.OK, "no Xid errors")))
    nodes = {n: NodeBundle(n) for n in ("node1", "node2")}
    text = summary(Collected(nodes, doctor, None, None, 1.0, None), Path("proj/../inv.yaml"))
    assert f"Inventory: `{Path.cwd() / 'inv.yaml'}`;" in text  # `-i ../inv.yaml`, as a path
    errors = text.split("## GPU errors found")[1].split("##")[0]
    assert "passed" not in errors
    assert "None found, but the kernel log could not be read on node1 (doctor `xid`: " \
           "kernel log not readable (dmesg_restrict=1)): Xid errors there are unknown." \
           in errors


def test_the_summary_names_the_nodes_slurm_does_not_call_healthy() -> None:
    # As collect.sh.j2 writes it: the heading, then SINFO's node|state|reason rows.
    sinfo = (f"{SINFO_HEADING}\nnode1|idle|none\nnode2|drained|bad GPU 3\n"
             "node3|down*|Not responding\n\n# sinfo -N -o '%N %G' (each node's GRES)\n"
             "node1 gpu:h100:8\n\n# squeue\n").encode()
    doctor = DoctorReport(("node1", "node2"), (), ())
    text = summary(Collected({"node1": NodeBundle("node1", {"slurm.txt": sinfo})}, doctor,
                             None, None, 1.0, None), Path("inv.yaml"))
    slurm = text.split("## Slurm")[1].split("##")[0]
    assert ("- **node2**: Slurm has it drained: bad GPU 3\n"
            "- **node3**: Slurm has it down* (its slurmd is not responding): Not responding"
            ) in slurm
    assert "node1" not in slurm
    healthy = sinfo.replace(b"drained", b"idle").replace(b"down*", b"mixed")
    text = summary(Collected({"node1": NodeBundle("node1", {"slurm.txt": healthy})}, doctor,
                             None, None, 1.0, None), Path("inv.yaml"))
    assert "Every node sinfo lists is healthy (3 nodes)." in text
    failed = f"{SINFO_HEADING}\nsinfo: error: Unable to contact slurm controller\n".encode()
    text = summary(Collected({"node1": NodeBundle("node1", {"slurm.txt": failed})}, doctor,
                             None, None, 1.0, None), Path("inv.yaml"))
    assert "sinfo failed: sinfo: error: Unable to contact slurm controller" in text
    without = summary(Collected({"node1": NodeBundle("node1")}, doctor, None, None, 1.0,
                                None), Path("inv.yaml"))
    assert "## Slurm" not in without


# The end of a failed exported job's output on the sandbox (two ranks, one node each).
TORCHRUN_REPORT = """Traceback (most recent call last):
  File "/w/fails.py", line 3, in <module>
    raise RuntimeError("boom")
RuntimeError: boom
Traceback (most recent call last):
  File "/w/fails.py", line 3, in <module>
    raise RuntimeError("boom")
RuntimeError: boom
E1203 03:49:38.942000 26138 api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 26347)
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
fails.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-03_03:49:38
  host      : node2
  rank      : 1 (local_rank: 0)
  exitcode  : 1 (pid: 26347)
  error_file: <N/A>
============================================================
srun: error: node2: task 1: Exited with exit code 1
"""


def test_a_slurm_jobs_bundle_says_how_it_ended_with_the_end_of_its_output() -> None:
    from gpucluster.bundle import slurm_job
    from gpucluster.slurm.follow import parse_job

    shown = ("JobId=4 JobName=train UserId=gcuser(2000) JobState=FAILED Reason=NonZeroExitCode "
             "ExitCode=1:0\n   StartTime=2026-12-03T03:40:12 EndTime=2026-12-03T03:41:00\n"
             "   NodeList=node[1-2] BatchHost=node1\n   StdOut=/srv/w/slurm-4.out\n")
    started = slurm_job._start_time(shown)
    assert started is not None and time.localtime(started)[:6] == (2026, 12, 3, 3, 40, 12)
    assert slurm_job._start_time("JobState=PENDING StartTime=Unknown") is None
    assert slurm_job._expand("node[1-2],gpu07") == ["node1", "node2", "gpu07"]
    assert slurm_job._expand("(null)") == []
    output = ("".join(f"step {i}\n" for i in range(30)) + TORCHRUN_REPORT).encode()
    job = slurm_job.SlurmJob("4", parse_job(shown), shown, output, "", ["node1", "node2"],
                             started)
    doctor = DoctorReport(("node1", "node2"), (), ())
    text = summary(Collected({}, doctor, None, None, 1.0, slurm_job=job), Path("inv.yaml"))
    part = text.split("## Slurm job 4")[1].split("\n## ")[0]
    assert "failed (exit 1:0) on node[1-2]; its output: `/srv/w/slurm-4.out` on node1." \
        in part
    assert "torchrun's first failure: rank 1 (local_rank: 0) on node2, exit code 1 " \
           "(pid: 26347), at 2026-12-03_03:49:38." in part
    assert "Its first error:\n\n```\nTraceback (most recent call last):\n  File " \
           "\"/w/fails.py\", line 3, in <module>\n    raise RuntimeError(\"boom\")\n" \
           "RuntimeError: boom\n```" in part
    tail = part.split("The last 20 lines of its output:")[1]
    assert tail.count("\n") == 20 + 4 and "step" not in tail  # 20, within ``` and blanks
    assert tail.rstrip().endswith("srun: error: node2: task 1: Exited with exit code 1\n```")
    assert "`slurm-job/output.log`" in text
    silent = slurm_job.SlurmJob("5", parse_job("JobId=5 JobState=PENDING Reason=Resources"),
                                "", b"", "it has not started", ["node1"], None)
    text = summary(Collected({}, doctor, None, None, 1.0, slurm_job=silent), Path("i.yaml"))
    assert "No output collected: it has not started." in text


def test_an_exported_slurm_jobs_bundle_names_its_failure_as_launch_does() -> None:
    """The real output of a job export sbatch wrote (srun's labels, torchrun's ranks): the
    first failure with its node, rank, last traceback and likely cause; its last lines as
    logs shows them."""
    from gpucluster.bundle import slurm_job
    from gpucluster.slurm.follow import parse_job

    shown = ("JobId=5 JobState=FAILED ExitCode=1:0 NodeList=node[1-2] BatchHost=node1 "
             "StdOut=/srv/w/slurm-5.out")
    output = (Path(__file__).parents[1] / "fixtures/slurm/died-in-a-bar-2-nodes.out"
              ).read_bytes()
    job = slurm_job.SlurmJob("5", parse_job(shown), shown, output, "", ["node1", "node2"],
                             None)
    doctor = DoctorReport(("node1", "node2"), (), ())
    text = summary(Collected({}, doctor, None, None, 1.0, slurm_job=job), Path("inv.yaml"))
    part = text.split("## Slurm job 5")[1].split("\n## ")[0]
    assert "**First failure: node1, rank 1** (exited, worker exit 1).\n\nIts last " \
           "traceback:\n\n```\nTraceback (most recent call last):\n" in part, part
    assert "Likely cause: the GPU ran out of memory (fix: " in part
    tail = part.split("The last 20 lines of its output:\n\n```\n")[1].split("```")[0]
    assert tail.splitlines()[-3:] == [
        "[node2] torch.distributed.elastic.multiprocessing.api.SignalException: Process 15155 "
        "got signal: 15", "[node2/3] bar 2/10[2]:bar 2/10",
        "srun: error: node2: task 1: Exited with exit code 1"]


def test_the_archives_path_is_checked_before_collecting_and_never_left_half_written(
        tmp_path: Path) -> None:
    import tarfile

    import pytest

    from gpucluster.bundle.archive import target, write
    from gpucluster.errors import GpuclusterError
    from gpucluster.launch.jobs import JobStore
    from gpucluster.whole_file import written_whole

    assert target(None, "b-1.tar.gz") == Path("b-1.tar.gz")
    assert target(tmp_path, "b-1.tar.gz") == tmp_path / "b-1.tar.gz"  # a directory: inside
    assert target(tmp_path / "mine", "b-1.tar.gz") == tmp_path / "mine.tar.gz"
    assert target(tmp_path / "mine.tgz", "b-1.tar.gz") == tmp_path / "mine.tgz"  # kept
    with pytest.raises(GpuclusterError, match=r"^/.*/gone/x.tar.gz: /.*/gone is not a "
                                              r"directory \(fix: mkdir -p /.*/gone, or"):
        target(tmp_path / "gone" / "x.tar.gz", "b-1.tar.gz")

    collected = Collected({"node1": NodeBundle("node1", {"dmesg.txt": b"Xid 79\n"})}, None,
                          None, None, 1.0, None)
    store = JobStore(tmp_path / ".gpucluster")
    written = tmp_path / "ok.tar.gz"
    assert write(collected, store, Path("inv.yaml"), written) == written.stat().st_size
    with tarfile.open(written) as archive:
        assert "ok/nodes/node1/dmesg.txt" in archive.getnames()
    assert written.stat().st_mode & 0o777 == 0o600
    # A job's bundle: its record, the controller's copies of its logs, and where each
    # rank was when a hang's stop (or stop --stacks) aborted it.
    from gpucluster.launch.jobs import JobRecord

    record = JobRecord("20261207-064430-4500", "train.py", [], ["node1"], "/c", "/j", 0.0,
                       {"node1": 1})
    store.save(record)
    (store.directory(record.id) / "node1.log").write_text("[0]:epoch 1\n")
    (store.directory(record.id) / "stacks.txt").write_text("== rank 0 on node1 ==\n")
    (store.directory(record.id) / "stacks-20261207-123134.txt").write_text("== rank 1 ==\n")
    with_job = tmp_path / "job.tar.gz"
    write(dataclasses.replace(collected, record=record), store, Path("inv.yaml"), with_job)
    with tarfile.open(with_job) as archive:
        assert {"job/job.json", "job/logs/node1.log", "job/stacks.txt",
                "job/stacks-20261207-123134.txt"} <= {
            name.split("/", 1)[1] for name in archive.getnames()}
        kept = archive.extractfile("job/job/stacks.txt")  # the archive's own dir first
        assert kept is not None and kept.read() == b"== rank 0 on node1 ==\n"
    short = tmp_path / "short.tgz"
    write(collected, store, Path("inv.yaml"), short)
    with tarfile.open(short) as archive:
        assert "short/nodes/node1/dmesg.txt" in archive.getnames()
    # A write that fails half way (the disk full) leaves neither the file nor the partial
    # one, and a directory where the file would go is said before anything is written.
    with pytest.raises(GpuclusterError, match=r"cut.tar.gz: cannot be written: No space "
                                              r"left on device \(nothing was left there\)$"), \
            written_whole(tmp_path / "cut.tar.gz", 0o600) as partial:
        partial.write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert sorted(p.name for p in tmp_path.glob("cut*")) == []
    (tmp_path / "jobs").mkdir()
    with pytest.raises(GpuclusterError, match=r"/jobs: is a directory \(fix: name a file"), \
            written_whole(tmp_path / "jobs", 0o644):
        pass


def test_a_node_without_iproute2_or_firewall_tools_still_describes_its_network(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The H200 machine we tried had no ip, iptables, nft or ufw: its network.txt was
    three 'ip: not found' lines, its firewall.txt bare headings."""
    import shutil

    from gpucluster.bundle.collect import _collect_on, collect_script
    from gpucluster.inventory import load
    from gpucluster.remote.local import LocalConnection

    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("sh", "timeout", "head", "base64", "cat", "grep", "tail", "id"):
        (tools / name).symlink_to(shutil.which(name) or f"/bin/{name}")
    monkeypatch.setenv("PATH", str(tools))
    inventory = tmp_path / "c.yaml"
    inventory.write_text("hosts: [localhost]\n")
    loaded = load(inventory)
    script = collect_script(loaded, loaded.hosts[0], "", time.time())
    # the sbin directories, where this machine has every firewall tool, are left out too
    assert script.count(':/usr/sbin:/sbin"') == 1
    script = script.replace(':/usr/sbin:/sbin"', '"')
    files = _collect_on(LocalConnection("localhost"), script, None).files
    network = files["network.txt"].decode()
    assert "no ip (iproute2) on this node" in network and "not found" not in network
    assert "# /proc/net/route\nIface" in network and "# /proc/net/dev\n" in network
    firewall = files["firewall.txt"].decode()
    for tool in ("iptables-save", "ip6tables-save", "nft", "ufw"):
        assert f"# {tool}\n(no {tool} on this node)" in firewall, firewall


def test_a_job_file_past_the_limit_arrives_as_its_end_and_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 15 MB node.log arrived as its first 8 MiB, said nowhere: the traceback at its
    end was not in the bundle; a file past 64 MiB did not arrive at all."""
    from gpucluster.bundle import collect
    from gpucluster.inventory import load
    from gpucluster.remote.local import LocalConnection

    monkeypatch.setattr(collect, "MAX_FILE_BYTES", 1000)
    job = tmp_path / "job dir"
    (job / "torchrun" / "0").mkdir(parents=True)
    (job / "node.log").write_text("".join(f"step {i}\n" for i in range(400))
                                  + "RuntimeError: the end\n")
    (job / "torchrun" / "0" / "stderr.log").write_text("short\n")
    (job / "exit_code").write_text("1 1796484000.5\n")
    inventory = tmp_path / "c.yaml"
    inventory.write_text("hosts: [localhost]\n")
    loaded = load(inventory)
    script = collect.collect_script(loaded, loaded.hosts[0], shlex.quote(str(job)),
                                    time.time())
    files = collect._collect_on(LocalConnection("localhost"), script, None).files
    whole = (job / "node.log").read_bytes()
    assert files["job/node.log"] == whole[-1000:] and len(whole) > 2000
    assert files["job/torchrun/0/stderr.log"] == b"short\n"
    assert files["job/exit_code"] == b"1 1796484000.5\n"
    assert files["job/CUT.txt"].decode() == (
        f"node.log: {len(whole)} bytes; its last 1000 are here\n")
    (job / "node.log").write_text("fits\n")
    files = collect._collect_on(LocalConnection("localhost"), script, None).files
    assert files["job/node.log"] == b"fits\n" and "job/CUT.txt" not in files


def test_a_bundle_without_job_names_the_newest_and_its_failure(tmp_path: Path) -> None:
    from gpucluster.cli.bundle_cmd import newest_job_hint
    from gpucluster.launch.jobs import JobStore

    store = JobStore(tmp_path)
    assert newest_job_hint(store) is None  # no job recorded: nothing to add
    for job_id in ("20261207-031700-0a00", "20261207-031713-3c39"):
        store.save(JobRecord(job_id, "fail.py", [], ["node4"], "/c", "/j", 0.0, {"node4": 1}))
    assert newest_job_hint(store) == ("no job's logs in it; gpucluster bundle last adds "
                                      "those of the newest job, 20261207-031713-3c39")
    store.note_failure("20261207-031713-3c39", "rank 3 on node4: exited 1")
    assert newest_job_hint(store) == ("no job's logs in it; gpucluster bundle last adds "
                                      "those of the newest job, 20261207-031713-3c39 "
                                      "(failed: rank 3 on node4: exited 1)")
