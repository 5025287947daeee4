"""Where each rank was when a hang was stopped, from the faulthandler dumps that the
stop script of a real hang on the sandbox reported (tests/fixtures/torch/README.md)."""

from __future__ import annotations

from pathlib import Path

from gpucluster.launch import hang_stacks
from gpucluster.launch.control import stop_result
from gpucluster.launch.hang_stacks import Frame, StackGroup
from gpucluster.launch.model import StopResult

CAPTURED = Path(__file__).parents[1] / "fixtures/torch/hang-stacks"
JOB = "20261207-064430-4500"


def _stopped() -> dict[str, StopResult]:
    return {node: stop_result(node, (CAPTURED / f"stop-{node}.txt").read_text())
            for node in ("node1", "node2", "node3")}


def test_the_stopped_rank_is_the_one_without_a_stack_beside_five_in_the_backward(
        tmp_path: Path) -> None:
    stopped = _stopped()
    assert {node: sorted(r.stacks) for node, r in stopped.items()} == {
        "node1": [0, 1], "node2": [2, 3], "node3": [4, 5]}
    assert stopped["node2"].stacks[3] == () and stopped["node2"].how == "term"
    groups = hang_stacks.read(stopped)
    assert groups == (
        StackGroup((0, 1, 2, 4, 5), "train.py line 128 in main, in _engine_run_backward "
                                    "(torch/autograd/graph.py line 979)",
                   ("node1", "node2", "node3")),
        StackGroup((3,), None, ("node2",), "stopped"))
    kept = hang_stacks.write(tmp_path / "jobs" / JOB,
                             {node: result.stacks for node, result in stopped.items()})
    said = hang_stacks.said(groups, kept)
    assert said[0] == f"where each rank was when the hang was stopped (each rank's whole " \
                      f"stack: {tmp_path}/jobs/{JOB}/stacks.txt):"
    # Every rank's whole dump, rank by rank, the stopped one's said to be none.
    text = kept.read_text()
    assert [line for line in text.splitlines() if line.startswith("==")] == [
        "== rank 0 on node1 ==", "== rank 1 on node1 ==", "== rank 2 on node2 ==",
        "== rank 3 on node2: no stack ==", "== rank 4 on node3 ==", "== rank 5 on node3 =="]
    assert text.count("Fatal Python error: Aborted") == 5
    assert text.count('"/srv/gpucluster/proj/train.py", line 128 in main') == 5
    assert said[1].startswith("  ranks 0-2,4-5: train.py line 128") and "(node" not in said[1]
    assert said[2] == "  rank 3 (node2): no stack: it was stopped (SIGSTOP, a debugger) and " \
                      "could not take the abort"
    assert hang_stacks.payload(groups)[1] == {"ranks": [3], "where": None, "nodes": ["node2"],
                                              "why": "stopped"}


def test_where_a_node_has_py_spy_the_stopped_rank_is_read_before_its_abort(
        tmp_path: Path) -> None:
    """The same hang where the nodes have py-spy (captured again): each held worker read
    before its abort, so the stopped rank, which writes no stack of its own, is said by
    where py-spy found it, and its dump kept is py-spy's."""
    stopped = {node: stop_result(node, (CAPTURED / "spied" / f"stop-{node}.txt").read_text())
               for node in ("node1", "node2", "node3")}
    assert {node: sorted(r.spied) for node, r in stopped.items()} == {
        "node1": [0, 1], "node2": [2, 3], "node3": [4, 5]}
    groups = hang_stacks.read(stopped)
    assert groups == (
        StackGroup((0, 1, 2, 4, 5), "train.py line 128 in main, in _engine_run_backward "
                                    "(torch/autograd/graph.py line 979)",
                   ("node1", "node2", "node3")),
        StackGroup((3,), "train.py line 132 in main (it was stopped: SIGSTOP, a debugger; "
                         "read by py-spy)", ("node2",), "stopped"))
    kept = hang_stacks.write(tmp_path, hang_stacks.kept_dumps(stopped)).read_text()
    assert "== rank 3 on node2 ==\nProcess " in kept  # py-spy's, the rank's own being none
    assert kept.count("Fatal Python error: Aborted") == 5  # the others' own


def test_each_rank_without_a_stack_is_said_by_how_it_ended() -> None:
    """The stop says how each aborted rank ended; those without a stack are grouped by
    it: stopped before the stop (the hang), still alive (stuck), or died without one;
    a node script from before said nothing (rank 5), an unknown word is taken so."""
    dump = (CAPTURED / "stop-node1.txt").read_text().split("@@gpc end 0")[0]
    dump = dump.split("\n", 1)[1]  # rank 0's, without its section line
    stopped = stop_result("node1", "".join(
        f"@@gpc section stack {rank}{fate}\n{text}@@gpc end 0\n"
        for rank, fate, text in ((0, " died", dump), (1, " stopped", ""), (2, " alive", ""),
                                 (3, " died", ""), (4, " stopped", ""), (5, "", ""),
                                 (6, " odd", "")))
        + "@@gpc stop kill 7 -\n")
    assert stopped.stack_fates == {0: "died", 1: "stopped", 2: "alive", 3: "died",
                                   4: "stopped", 5: "", 6: "odd"}
    groups = hang_stacks.read({"node1": stopped})
    assert [(g.ranks, g.why) for g in groups] == [
        ((0,), None), ((1, 4), "stopped"), ((5, 6), ""), ((2,), "alive"), ((3,), "died")]
    said = hang_stacks.said(groups, Path("stacks.txt"))
    assert said[2] == "  ranks 1,4 (node1): no stack: it was stopped (SIGSTOP, a debugger) " \
                      "and could not take the abort"
    assert said[3].startswith("  ranks 5-6 (node1): no stack: it did not die of SIGABRT")
    assert said[4].startswith("  rank 2 (node1): no stack: still alive 3 s after the abort")
    assert said[5].startswith("  rank 3 (node1): no stack: it died without writing one")


def test_no_stack_at_all_says_nothing() -> None:
    """A job in a container, or with faulthandler turned off: nothing to compare."""
    silent = stop_result("node1", "@@gpc section stack 0\n@@gpc end 0\n@@gpc stop term 3 -\n")
    assert silent.stacks == {0: ()}
    assert hang_stacks.read({"node1": silent}) == ()
    assert hang_stacks.said((), Path("stacks.txt")) == []
    assert hang_stacks.read({"node1": stop_result("node1", "@@gpc stop term 3 -\n")}) == ()


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
    frames = hang_stacks.main_thread(dump)
    assert frames is not None and frames[0] == Frame(
        "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2806,
        "all_reduce")
    assert len(frames) == 3  # the line after the dump's end is no frame of it
    assert hang_stacks.where(frames) == \
        "lib/step.py line 9 in step, in all_reduce (torch/distributed/distributed_c10d.py " \
        "line 2806)"
    # Stopped in the script's own code: that frame alone.
    assert hang_stacks.where(frames[1:]) == "lib/step.py line 9 in step"
    # No script file (python -c): the innermost frame, its path as it stands.
    assert hang_stacks.where((Frame("/a/b.py", 3, "f"), Frame("<string>", 1, "<module>"))) \
        == "/a/b.py line 3 in f"
    assert hang_stacks.main_thread([]) is None


def test_jobs_notes_a_hangs_ranks_apart_from_the_rest() -> None:
    """The line `jobs` shows for an attempt that hung, noted as the attempt ends: the
    ranks elsewhere than most, or without a stack, beside the hang's words."""
    from gpucluster.launch.attempt_report import AttemptReport, failure_note

    hang = AttemptReport(1, JOB, ("node1", "node2", "node3"), "hang",
                         "no rank made progress for 15s (--hang-timeout 15)", 70.0,
                         stacks=hang_stacks.read(_stopped()))
    assert failure_note(hang) == \
        "hang: no rank made progress for 15s (--hang-timeout 15); rank 3: no stack (stopped)"
    lost = AttemptReport(1, JOB, ("node1",), "node lost", "node1: unreachable", 5.0)
    assert failure_note(lost) == "node lost: node1: unreachable"
    error = AttemptReport(1, JOB, ("node1",), "worker error", "rank 1 on node1: boom", 5.0)
    assert failure_note(error) == "rank 1 on node1: boom"
