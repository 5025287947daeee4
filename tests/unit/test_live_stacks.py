"""`gpucluster stacks`: where each rank of a running job is now, read by py-spy without
stopping it. Captured from a 3-node sandbox job of examples/train.py, 2 ranks a node,
rank 3 stopped with SIGSTOP mid-run (the others then wait for it in the backward's
all-reduce)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from gpucluster.errors import GpuclusterError
from gpucluster.launch import hang_stacks, live_stacks
from gpucluster.launch.hang_stacks import Frame, StackGroup
from gpucluster.launch.jobs import JobStore
from tests.local_job import LOGGING_TORCHRUN_STAND_IN, local_job

CAPTURED = Path(__file__).parents[1] / "fixtures/torch/live-stacks"
NODES = ("node1", "node2", "node3")
STOPPED = "train.py line 132 in main" + live_stacks.STOPPED


def _looked(prefix: str = "") -> dict[str, live_stacks.NodeStacks]:
    return {node: live_stacks.node_stacks(node, (CAPTURED / f"{prefix}{node}.txt").read_text())
            for node in NODES}


def test_the_stopped_rank_is_named_apart_from_the_five_that_wait_for_it() -> None:
    looked = _looked()
    assert {node: (r.workers, r.processes, sorted(r.dumps), sorted(r.stopped))
            for node, r in looked.items()} == {
        "node1": (2, 4, [0, 1], []), "node2": (2, 4, [2, 3], [3]), "node3": (2, 4, [4, 5], [])}
    assert live_stacks.read(looked) == (
        StackGroup((0, 1, 2, 4, 5), "train.py line 128 in main, in _engine_run_backward "
                   "(torch/autograd/graph.py line 979)", NODES),
        StackGroup((3,), STOPPED, ("node2",)))


def test_native_frames_name_what_the_rank_waits_in_not_the_c_library() -> None:
    """With --native the innermost frame is libc's (`pthread_cond_wait`, or an address
    it could not name, which would split ranks waiting at one place); the one said is
    the innermost above the C library and the C++ runtime."""
    groups = live_stacks.read(_looked("native-"))
    assert [(g.ranks, g.where) for g in groups] == [
        ((0, 1, 2, 4, 5), "train.py line 128 in main, in c10d::Reducer::finalize_backward "
                          "(libtorch_cpu.so)"),
        ((3,), STOPPED)]  # a stopped process is read without native frames


def test_py_spys_dump_is_read_to_its_main_thread() -> None:
    dump = ["Process 7: python -u train.py", "Python v3.11.7 (/usr/bin/python3.11)", "",
            'Thread 9 (idle): "pt_autograd_0"', "    run (/v/site-packages/x.py:4)",
            'Thread 7 (active+gil): "MainThread"', "    step (/srv/p/lib/step.py:9)",
            "        Arguments:", "            n: 3",
            "    main (/srv/p/train.py:12)", "    <module> (/srv/p/train.py:20)"]
    assert hang_stacks.spy_main_thread(dump) == (
        Frame("/srv/p/lib/step.py", 9, "step"), Frame("/srv/p/train.py", 12, "main"),
        Frame("/srv/p/train.py", 20, "<module>"))
    unnamed = ["Thread 0x7F (idle)", "    f (/a/b.py:3)", "Thread 0x80 (idle)",
               "    g (/a/c.py:5)", "    <module> (/a/c.py:9)"]
    assert hang_stacks.spy_main_thread(unnamed) == (Frame("/a/c.py", 5, "g"),
                                               Frame("/a/c.py", 9, "<module>"))
    assert hang_stacks.spy_main_thread(["Error: Failed to find python version"]) is None


@pytest.mark.parametrize(("code", "text", "why"), [
    (0, 'Thread 1 (idle)\n    f (/a.py:1)', ""),
    (127, "py-spy: not found", "no-spy"),
    (124, "", "timeout"),
    (1, "Error: Permission denied (os error 13)", "denied"),
    (1, "Error: Failed to find process 4242: No such process", "ended"),
    (1, "Error: Failed to find python version from target process", "failed"),
])
def test_why_a_rank_has_no_stack(code: int, text: str, why: str) -> None:
    looked = live_stacks.node_stacks(
        "node1", f"@@gpc workers 1 2\n@@gpc section stack 0 42 S\n{text}\n@@gpc end {code}\n")
    assert looked.why == {0: why}
    if why:
        assert live_stacks.read({"node1": looked}) == (StackGroup((0,), None, ("node1",), why),)
        assert why in live_stacks.NO_STACK


def test_a_node_that_did_not_run_the_script_is_an_error() -> None:
    looked = live_stacks.node_stacks("node1", "", "sh: 1: cannot fork")
    assert looked.error == "sh: 1: cannot fork" and looked.workers == 0


def test_stacks_reads_a_running_job_on_this_machine_and_leaves_it_running(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real node script against a job started here (`connection: local`): its rank
    read where it sleeps and left running, then read again stopped (SIGSTOP); its whole
    stack kept beside the job's logs."""
    from typer.testing import CliRunner

    from gpucluster.cli.main import app
    from gpucluster.state import state_dir_for

    with local_job(tmp_path, LOGGING_TORCHRUN_STAND_IN) as (loaded, record):
        store = JobStore(state_dir_for(loaded))
        store.save(record)
        worker = int((tmp_path / "worker.pid").read_text())
        result = CliRunner().invoke(app, ["stacks", "-i", str(loaded.path), record.id])
        assert result.exit_code == 0, result.output
        kept = sorted(store.directory(record.id).glob("stacks-*.txt"))
        assert result.stdout.splitlines() == [
            f"where each rank of job {record.id} is now (each rank's whole stack: "
            f"{kept[-1]}):", "  rank 3 (node1): worker.py line 11 in <module>"]
        assert kept[-1].read_text().startswith("== rank 3 on node1 ==\nProcess ")
        os.kill(worker, 0)  # still running
        os.kill(worker, signal.SIGSTOP)
        try:
            result = CliRunner().invoke(app, ["stacks", "-i", str(loaded.path), record.id,
                                              "--json"])
        finally:
            os.kill(worker, signal.SIGCONT)
        assert result.exit_code == 0, result.output
        said = json.loads(result.stdout)
        assert set(said) == {"schema", "job", "stacks", "kept", "nodes"}  # pinned
        assert said["stacks"] == [{"ranks": [3], "nodes": ["node1"], "why": None,
                                   "where": "worker.py line 11 in <module>"
                                            + live_stacks.STOPPED}]
        assert said["nodes"] == {"node1": {"ranks": 1, "error": None}}
        os.kill(worker, 0)


def test_without_py_spy_on_the_nodes_the_fix_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """py-spy neither on the PATH nor beside the rank's Python (/usr/bin/python3 here)."""
    from typer.testing import CliRunner

    from gpucluster.cli.main import app
    from gpucluster.state import state_dir_for

    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    system_python = LOGGING_TORCHRUN_STAND_IN.replace("[sys.executable,",
                                                       '["/usr/bin/python3",')
    with local_job(tmp_path, system_python) as (loaded, record):
        JobStore(state_dir_for(loaded)).save(record)
        result = CliRunner().invoke(app, ["stacks", "-i", str(loaded.path), record.id])
    assert isinstance(result.exception, GpuclusterError), result.output
    assert str(result.exception) == f"py-spy is not installed on node1 (fix: " \
                                    f"{live_stacks.PY_SPY_FIX})"


def test_an_apptainer_jobs_ranks_are_found_past_its_starter(tmp_path: Path) -> None:
    """Under apptainer a starter process stands between the job's leader and torchrun
    (here a Python one), so the leader's grandchildren are torchrun, not the ranks: a
    .sif job's ranks are its processes with a RANK their parent lacks. Read live, then
    aborted by stop --stacks, each says where it was."""
    import dataclasses

    from typer.testing import CliRunner

    from gpucluster.cli.main import app
    from gpucluster.state import state_dir_for

    (tmp_path / "inner_torchrun.py").write_text(LOGGING_TORCHRUN_STAND_IN)
    starter = "import subprocess, sys\n" \
              "sys.exit(subprocess.call([sys.executable, 'inner_torchrun.py']))\n"
    with local_job(tmp_path, starter) as (loaded, record):
        sif = dataclasses.replace(record, image="train.sif")
        JobStore(state_dir_for(loaded)).save(sif)
        looked = CliRunner().invoke(app, ["stacks", "-i", str(loaded.path), sif.id, "--json"])
        stopped = CliRunner().invoke(app, ["stop", "-i", str(loaded.path), sif.id, "--stacks",
                                           "--json"])
    where = [{"ranks": [3], "where": "worker.py line 11 in <module>", "nodes": ["node1"],
              "why": None}]
    assert looked.exit_code == 0 and json.loads(looked.stdout)["stacks"] == where, \
        looked.output
    assert stopped.exit_code == 0 and json.loads(stopped.stdout)["stacks"] == where, \
        stopped.output


# A Slurm job's ranks as srun's task starts them: torchrun (no RANK) and its worker, which
# has a child of its own (a DataLoader worker: RANK inherited, not a rank).
_SLURM_TASK = """
import os, subprocess, sys, time
worker = os.environ.get("RANK") is None
if worker:
    env = {**os.environ, "RANK": "2", "LOCAL_RANK": "0"}
    child = subprocess.Popen([sys.executable, sys.argv[0]], env=env)
    with open("task.pid", "w") as out: out.write(f"{os.getpid()} {child.pid}")
    child.wait()
elif not os.environ.get("LOADER"):
    loader = subprocess.Popen([sys.executable, sys.argv[0]], env={**os.environ, "LOADER": "1"})
    open("ready", "w").close()
    time.sleep(60)
else:
    time.sleep(60)
"""


def test_a_slurm_jobs_ranks_are_found_by_its_id_on_the_nodes_slurm_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`stacks slurm-ID`: the nodes from scontrol, the ranks by SLURM_JOB_ID and a RANK
    their parent lacks (not a DataLoader worker, which inherits it)."""
    import subprocess
    import sys

    from typer.testing import CliRunner

    from gpucluster.cli.main import app
    from tests.local_job import wait_for
    from tests.stand_ins import stand_in

    stand_in(tmp_path / "bin", "scontrol", "echo 'JobId=77 JobState=RUNNING BatchHost=node1 "
                                           "ExitCode=0:0 NodeList=node1 Reason=None'\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    inventory = tmp_path / "c.yaml"
    inventory.write_text("hosts:\n  - {name: node1, address: 127.0.0.1, connection: local}\n")
    refused = CliRunner().invoke(app, ["stacks", "-i", str(inventory), "slurm-77"])
    assert str(refused.exception) == f"slurm-77: Slurm is not set up for {inventory} (fix: " \
                                     f"gpucluster provision --with slurm)"
    inventory.write_text(inventory.read_text() + "slurm: {}\n")  # the section enables it
    (tmp_path / "task.py").write_text(_SLURM_TASK)
    task = subprocess.Popen([sys.executable, "task.py"], cwd=tmp_path,
                            env={**os.environ, "SLURM_JOB_ID": "77"}, start_new_session=True)
    try:
        wait_for((tmp_path / "ready").exists)
        result = CliRunner().invoke(app, ["stacks", "-i", str(inventory), "slurm-77", "--json"])
    finally:
        os.killpg(task.pid, signal.SIGKILL)
        task.wait()
    assert result.exit_code == 0, result.output
    said = json.loads(result.stdout)
    assert said["job"] == "slurm-77" and said["nodes"] == {"node1": {"ranks": 1, "error": None}}
    # the rank's sleep (line 12), not its loader's (line 14)
    assert said["stacks"] == [{"ranks": [2], "where": "task.py line 12 in <module>",
                               "nodes": ["node1"], "why": None}], said
