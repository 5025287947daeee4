"""A Slurm job's output file, shown as `logs` shows a launched job's: `[node/rank] text`.

The script `export sbatch` writes runs srun with `--label`, so each line of a task comes
behind its task number (`2: `), and torchrun with its tee, so a rank's line comes behind
its global rank (`[5]:`), as under launch. Each task says first which node it is on
(`2: gpucluster: node3 is task 2`), again at each start after a requeue (a read of the
file's end gets those lines too: slurm/follow); a task not heard saying so is `task 2`.
Lines without a label (the batch script's own, such as a requeue's, and a hand-written
script's output) are passed on as the file has them."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable

from gpucluster.launch.bar_draws import BarDraws, Shown
from gpucluster.launch.failure import failure_in
from gpucluster.launch.model import FirstFailure, NodeState
from gpucluster.launch.tee_lines import ranked

LABEL = re.compile(r" *(\d+): ")  # srun --label's, padded where there are 10 tasks or more
_TASK_IS = re.compile(r"gpucluster: (\S+) is task \d+")
# A task's word of its node as a whole line of the file (grep -E), label and all.
TASK_LINE_ERE = "^ *[0-9]+: gpucluster: [^ ]+ is task [0-9]+$"
# A line's start that may still become a label: held until the rest of it comes.
_LABEL_SO_FAR = re.compile(r" *\d*:?")
# The batch script's word that Slurm started the job again (templates/slurm/sbatch.sh.j2).
_REQUEUED = re.compile(r"gpucluster: Slurm job \d+ requeued: start \d+")

NodeLine = Callable[[str, "str | None", str], None]  # node, rank (None: torchrun's), text
# Each node's last lines kept for its failure: torchrun's report of it, its rank's
# traceback (a rank that fails prints little after it).
FAILURE_LINES = 2000


class SlurmLines:
    """The file's text as it is read, chunk by chunk, to `on_line` (a labelled line, as
    [node/rank]) and `as_written` (the rest, as the file has it, and at once: a
    hand-written job's progress bar is drawn as it comes). Live, a rank's bar draws are
    thinned as launch thins them."""

    def __init__(self, on_line: NodeLine, as_written: Callable[[str], None],
                 live: bool) -> None:
        self._on_line, self._as_written, self._live = on_line, as_written, live
        self._nodes: dict[str, str] = {}  # task -> node, as the tasks said
        self._draws: dict[str, BarDraws] = {}
        self._last: dict[str, deque[str]] = {}  # node -> its last lines, as torchrun's tee's
        self._open = ""  # a line's start, its end not read yet
        self._written_open = False  # a line without a label being written as it comes

    def feed(self, text: str) -> None:
        *lines, self._open = (self._open + text).split("\n")
        for line in lines:
            self._line(line)
        if self._open and (self._written_open or not (LABEL.match(self._open) or
                                                      _LABEL_SO_FAR.fullmatch(self._open))):
            self._as_written(self._open)  # no label: written as it comes
            self._open, self._written_open = "", True
        if self._live:
            for node, draws in self._draws.items():
                self._pass_on(node, draws.due())

    def finish(self) -> None:
        """The last line, though it has no end, and each rank's last bar draw."""
        if self._open:
            self._line(self._open, ended=False)
            self._open = ""
        for node, draws in self._draws.items():
            self._pass_on(node, draws.rest())

    def _line(self, line: str, ended: bool = True) -> None:
        label = None if self._written_open else LABEL.match(line)
        if label is None:
            if not self._written_open and _REQUEUED.match(line):
                self._last.clear()  # a failure of an earlier start is not this start's
            self._as_written(line + "\n" if ended else line)
            self._written_open = False
            return
        task, text = label[1], line[label.end():]
        said = _TASK_IS.fullmatch(text)
        if said:
            self._nodes[task] = said[1]
            return
        node = self._nodes.get(task) or f"task {task}"
        self._last.setdefault(node, deque(maxlen=FAILURE_LINES)).append(text)
        draws = self._draws.setdefault(node, BarDraws() if self._live else
                                       BarDraws(every_s=0, live=False))
        for piece in ranked(text):
            self._pass_on(node, draws.take(piece))

    def first_failure(self) -> FirstFailure | None:
        """The failure torchrun reported first (its Root Cause's time) in the job's last
        start, among the lines read: its node, rank, worker's exit code and what its words
        say of the cause."""
        failures = [failure_in(node, NodeState(node, "exited"), lines)
                    for node, lines in self._last.items()]
        reported = [failure for failure in failures if failure.failed_at]
        return min(reported, key=FirstFailure.order, default=None)

    def _pass_on(self, node: str, shown: Shown) -> None:
        for rank, text in shown:
            self._on_line(node, rank, text)

