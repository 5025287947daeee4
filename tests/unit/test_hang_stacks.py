"""Where each rank was when a hang was stopped, from faulthandler's dumps in the real
logs of a hang on the sandbox (tests/fixtures/torch/README.md)."""

from __future__ import annotations

import shutil
from pathlib import Path

from gpucluster.launch import hang_stacks
from gpucluster.launch.hang_stacks import Frame, StackGroup
from gpucluster.launch.jobs import JobRecord, JobStore
from gpucluster.launch.logsearch import LogLine

CAPTURED = Path(__file__).parents[1] / "fixtures/torch/hang-stacks"
JOB = "20261207-061622-262c"


def _record(nodes: tuple[str, ...] = ("node1", "node2", "node3")) -> JobRecord:
    return JobRecord(JOB, "train.py", [], list(nodes), "/srv/gpucluster/proj",
                     "/srv/gpucluster/jobs", 1796624182.0, dict.fromkeys(nodes, 2))


def _store(tmp_path: Path) -> JobStore:
    store = JobStore(tmp_path)
    store.directory(JOB).mkdir(parents=True)
    for log in CAPTURED.glob("*.log"):
        shutil.copy(log, store.directory(JOB) / log.name)
    return store


def test_the_stopped_rank_is_the_one_without_a_stack_beside_five_in_the_backward(
        tmp_path: Path) -> None:
    groups = hang_stacks.read(_store(tmp_path), _record())
    assert groups == (
        StackGroup((0, 1, 2, 4, 5), "train.py line 128 in main, in _engine_run_backward "
                                    "(torch/autograd/graph.py line 979)",
                   ("node1", "node2", "node3")),
        StackGroup((3,), None, ("node2",)))
    said = hang_stacks.said(groups, JOB)
    assert said[0].endswith(f"(its whole stack: gpucluster logs {JOB} --rank R):")
    assert said[1].startswith("  ranks 0-2,4-5: train.py line 128") and "(node" not in said[1]
    assert said[2] == "  rank 3 (node2): no stack: it did not die of SIGABRT (stopped, or " \
                      "stuck in the kernel or a driver call)"


def test_no_stack_at_all_says_nothing(tmp_path: Path) -> None:
    """A job in a container, or with faulthandler turned off: nothing to compare."""
    store = JobStore(tmp_path)
    store.directory(JOB).mkdir(parents=True)
    (store.directory(JOB) / "node1.log").write_text("[0]:epoch 1\n[1]:epoch 1\n")
    assert hang_stacks.read(store, _record(("node1",))) == ()
    assert hang_stacks.said((), JOB) == []


def test_the_main_thread_is_the_one_that_began_in_the_script_wherever_the_signal_landed(
        ) -> None:
    dump = ["Fatal Python error: Aborted", "",
            "Current thread 0x00007f01 (most recent call first):",
            '  File "/usr/lib/python3.11/threading.py", line 327 in wait',
            '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap', "",
            "Thread 0x00007f02 (most recent call first):",
            '  File "/venv/lib/python3.11/site-packages/torch/distributed/'
            'distributed_c10d.py", line 2806 in all_reduce',
            '  File "/code/lib/step.py", line 9 in step',
            '  File "/code/train.py", line 40 in <module>', "",
            "Extension modules: torch._C (total: 1)",
            '  File "/code/after.py", line 1 in not_the_dump']
    lines = [LogLine(0.0, JOB, "node1", 7, text) for text in dump]
    frames = hang_stacks.main_threads(lines)[7]
    assert frames[0] == Frame("/venv/lib/python3.11/site-packages/torch/distributed/"
                              "distributed_c10d.py", 2806, "all_reduce")
    assert len(frames) == 3  # the line after the dump's end is no frame of it
    assert hang_stacks.where(frames, "/code") == \
        "lib/step.py line 9 in step, in all_reduce (torch/distributed/distributed_c10d.py " \
        "line 2806)"
    # Stopped in the script's own code: that frame alone.
    assert hang_stacks.where(frames[1:], "/code/") == "lib/step.py line 9 in step"
    # torchrun's own lines (no rank) are never a rank's dump.
    assert hang_stacks.main_threads([LogLine(0.0, JOB, "node1", None, t) for t in dump]) == {}
