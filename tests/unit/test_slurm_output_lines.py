"""A Slurm job's output file shown as a launched job's lines: `[node/rank] text` from
srun's labels, the tasks' word of their node and torchrun's ranks; the rest as written."""

from __future__ import annotations

import io
from pathlib import Path

from gpucluster.cli.views.line_printer import LinePrinter
from gpucluster.slurm.output_lines import SlurmLines

FIXTURES = Path(__file__).parents[1] / "fixtures/slurm"


def shown(chunks: list[str], live: bool = False, full_logs: str | None = None) -> list[str]:
    out = io.StringIO()
    printer = LinePrinter(out, full_logs=full_logs, live=live)
    lines = SlurmLines(printer, printer.as_written, live)
    for chunk in chunks:
        lines.feed(chunk)
    lines.finish()
    printer.finish()
    return out.getvalue().splitlines()


def test_each_line_of_a_3_node_job_says_its_node_and_rank() -> None:
    """The real thing: the tasks' word of their node is not shown, every other line is,
    behind its node and global rank, in the file's order."""
    text = (FIXTURES / "train-3-nodes.out").read_text()
    assert shown([text]) == [
        "[node3/4] rank 4/6 on node3 ready", "[node2/3] rank 3/6 on node2 ready",
        "[node2/2] rank 2/6 on node2 ready", "[node1/0] rank 0/6 on node1 ready",
        "[node3/5] rank 5/6 on node3 ready", "[node1/1] rank 1/6 on node1 ready",
        "[node1/0] epoch 0 loss 0.1991", "[node1/0] epoch 1 loss 0.0135",
        "[node1/0] epoch 2 loss 0.0101", "[node1/0] done"]
    # Read as follow reads it, in chunks cut anywhere: the same lines.
    cut = [text[at:at + 7] for at in range(0, len(text), 7)]
    assert shown(cut) == shown([text])


def test_a_failed_job_shows_live_as_launch_shows_one() -> None:
    """The real thing: a rank died in its bar on node1. Live, torchrun's own traceback
    is one line naming the command that prints it; srun's own lines are as written."""
    text = (FIXTURES / "died-in-a-bar-2-nodes.out").read_text()
    live = shown([text], live=True, full_logs="gpucluster logs slurm-5")
    at = live.index("[node1/1] Traceback (most recent call last):")
    assert live[at + 3] == "[node1/1] RuntimeError: CUDA out of memory. Tried to allocate " \
                           "2.00 GiB"
    assert "[node2] (26 lines of torchrun's own traceback left out: gpucluster logs " \
           "slurm-5 prints them)" in live
    assert "srun: error: node1: task 0: Exited with exit code 1" in live
    assert not [line for line in live if line.startswith(("0: ", "1: "))]
    assert not [line for line in live if "is task" in line]
    whole = shown([text])  # not live: every line of the file but the tasks' word
    assert len(whole) == len(text.splitlines()) - 2
    assert "[node2]   File \"/opt/gpucluster/node-python/bin/torchrun\", line 8, in " \
           "<module>" in whole


def test_a_task_that_did_not_say_its_node_is_named_by_its_number() -> None:
    """A script of the user's own with srun --label: where its tasks run is not guessed
    (several may share a node)."""
    assert shown(["0: gpucluster: gpu07 is task 0\n", "1: [2]:step 9\n", "0: [0]:step 9\n"]
                 ) == ["[task 1/2] step 9", "[gpu07/0] step 9"]


def test_after_a_requeue_the_tasks_word_of_the_new_start_holds() -> None:
    out = ["0: gpucluster: node1 is task 0\n", "1: gpucluster: node2 is task 1\n",
           "1: [1]:epoch 3\n",
           "gpucluster: Slurm job 9 requeued: start 2, on node[1,3], 2026-12-06 07:44 UTC\n",
           "0: gpucluster: node1 is task 0\n", "1: gpucluster: node3 is task 1\n",
           "1: gpucluster: node3: fetched Slurm job 9's checkpoints from node1\n",
           "1: [1]:resumed from epoch 3 (attempt 2)\n"]
    assert shown(out) == [
        "[node2/1] epoch 3",
        "gpucluster: Slurm job 9 requeued: start 2, on node[1,3], 2026-12-06 07:44 UTC",
        "[node3] gpucluster: node3: fetched Slurm job 9's checkpoints from node1",
        "[node3/1] resumed from epoch 3 (attempt 2)"]


def test_a_hand_written_jobs_output_is_written_as_it_comes() -> None:
    """No label: the file's bytes, a bar's draw as soon as it is read; a labelled line
    is held until its end comes."""
    out = io.StringIO()
    printer = LinePrinter(out, live=True)
    lines = SlurmLines(printer, printer.as_written, live=True)
    lines.feed("start\n\rstep 1")
    assert out.getvalue() == "start\n\rstep 1"
    lines.feed("\rstep 2")
    assert out.getvalue() == "start\n\rstep 1\rstep 2"
    lines.feed("\n1")  # a label's start, perhaps
    assert out.getvalue() == "start\n\rstep 1\rstep 2\n"
    lines.feed("2: [3]:epo")
    assert out.getvalue() == "start\n\rstep 1\rstep 2\n"
    lines.feed("ch 1\n12 monkeys\n")
    assert out.getvalue().endswith("\n[task 12/3] epoch 1\n12 monkeys\n")
    lines.feed("0: [0]:no end")
    lines.finish()
    printer.finish()
    assert out.getvalue().endswith("12 monkeys\n[task 0/0] no end\n")


def test_the_first_failure_is_named_from_torchruns_report_and_the_ranks_words() -> None:
    """The real thing: rank 1 on node1 raised CUDA's out-of-memory error; node2's
    torchrun was ended after it (its own traceback of the signal, no Root Cause)."""
    lines = SlurmLines(lambda node, rank, text: None, lambda text: None, live=True)
    lines.feed((FIXTURES / "died-in-a-bar-2-nodes.out").read_text())
    lines.finish()
    failure = lines.first_failure()
    assert failure is not None
    assert (failure.node, failure.rank, failure.worker_exit) == ("node1", 1, 1)
    assert failure.cause is not None and failure.cause.name == "gpu-out-of-memory"
    assert failure.rank_error[-1] == "RuntimeError: CUDA out of memory. Tried to allocate " \
                                     "2.00 GiB"
    done = SlurmLines(lambda node, rank, text: None, lambda text: None, live=False)
    done.feed((FIXTURES / "train-3-nodes.out").read_text())
    assert done.first_failure() is None
    # Requeued (its node lost), the job failed again: the last start's failure is named.
    again = SlurmLines(lambda node, rank, text: None, lambda text: None, live=False)
    again.feed((FIXTURES / "died-in-a-bar-2-nodes.out").read_text())
    again.feed("gpucluster: Slurm job 5 requeued: start 2, on node[2-3], 2026-12-06 07:44:02 UTC\n"
               "0: gpucluster: node2 is task 0\n1: gpucluster: node3 is task 1\n"
               "1: [3]:ValueError: bad shard\n"
               "1: Root Cause (first observed failure):\n1: [0]:\n"
               "1:   time      : 2026-12-06_07:50:00\n1:   host      : node3\n"
               "1:   rank      : 3 (local_rank: 1)\n1:   exitcode  : 2 (pid: 77)\n")
    failure = again.first_failure()
    assert failure is not None and (failure.node, failure.rank, failure.worker_exit) == \
        ("node3", 3, 2), failure

