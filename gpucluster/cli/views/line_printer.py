"""The live view of a job's lines: each whole, prefixed [node/rank], from every node's
thread, with the backtraces torch and torchrun print, and the Python stack of a rank
aborted (a hang's stop), folded into one line each."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import TextIO

from gpucluster.cli.views.common import discard_writes
from gpucluster.cli.views.terminal_text import printable
from gpucluster.launch.hang_stacks import ABORTED, DUMP_END, DUMP_LINE
from gpucluster.launch.logsearch import where
from gpucluster.launch.model import OutputClosed
from gpucluster.launch.tee_lines import TRACEBACK_START, FailureSummary
from gpucluster.wording import counted

# A C++ backtrace as torch's c10 errors print it: the line that says where the error was
# raised (which stays), then one line per frame.
_BACKTRACE_START = re.compile(r"Exception raised from .* \(most recent call first\):$")
_BACKTRACE_FRAME = re.compile(r"frame #[0-9]+: |<omitting python frames>$")
# A Python traceback's frames, indented, up to its exception line.
_PYTHON_FRAME = re.compile(r"\s")
# What a node's torchrun agent says when the rendezvous store is gone as it closes it.
_RENDEZVOUS_NOT_CLOSED = re.compile(r"has failed to shutdown the rendezvous ")
BATCH_LINES = 1000  # not live: lines written at once
AS_WRITTEN = ""  # the node of text written as it came, no node's line


class LinePrinter:
    """Lines from all nodes, each whole, prefixed [node/rank] (or [node] for torchrun).

    Live (`full_logs` names the command that prints a job's lines in full; recovery
    names each attempt's as it starts), a C++ backtrace becomes one line: torch prints
    20-30 frames even for a warning, such as the one a multi-node job can end with on the
    nodes but the head (whose agent, done first, took the rendezvous store with it). So
    do the frames of torchrun's own tracebacks (no rank's: torch's launcher, never the
    script): 25 lines on every node a failure stopped, of the SIGTERM it was sent. The
    node's log keeps them.

    A stream that cannot be written (stdout redirected to a full disk) stops taking
    lines, said once on `notes`; the job and its follow go on (the error used to end the
    node's follower, and the node was taken for lost: --recover relaunched the job).

    Each node's lines come from a thread of its own. Whichever thread holds the lock
    writes every line waiting, its own and the others', and flushes once; the others
    leave theirs and go on. (A lock taken per line cost 3.3 s of 8.9 for `logs` of two
    nodes' 800000 lines: the threads queued on it, a wake-up per line.)"""

    def __init__(self, stream: TextIO, notes: TextIO | None = None,
                 full_logs: str | None = None, live: bool = True) -> None:
        self._stream, self._notes, self.full_logs = stream, notes, full_logs
        # Live, each line reaches the stream as it comes; else a batch at a time and the
        # rest at finish(), as cat's do (a flush per line was most of the time `logs JOB`
        # took to print 600000 lines; then a write per line, 1.4 s of 3.6).
        self._live = live
        self._lock = threading.Lock()
        self._waiting: deque[tuple[str, str | None, str]] = deque()
        self._failed = False
        # Per node and rank inside a backtrace: its frames left out so far.
        self._folds: dict[tuple[str, str | None], _Fold] = {}
        # Nodes whose agent could not close the rendezvous: after a clean end, torch's
        # teardown race, which print_outcome then names as such.
        self.rendezvous_not_closed: set[str] = set()
        self.heard: set[str] = set()  # nodes whose lines came
        # Per node: its torchrun's failure summary, whose "[0]:" is no rank's line.
        self._summaries: dict[str, FailureSummary] = {}

    def __call__(self, node: str, rank: str | None, text: str) -> None:
        self.heard.add(node)
        self._take((node, rank, text))

    def as_written(self, text: str) -> None:
        """Text that is no node's line (a Slurm batch script's own output), written as it
        came, in its place among the lines."""
        self._take((AS_WRITTEN, None, text))

    def _take(self, line: tuple[str, str | None, str]) -> None:
        self._waiting.append(line)
        if not self._live and len(self._waiting) < BATCH_LINES:
            return
        # A line left while another thread wrote is in `_waiting` when that thread,
        # having let go of the lock, looks again.
        while self._waiting and self._lock.acquire(blocking=False):
            try:
                self._write_waiting()
            finally:
                self._lock.release()

    def finish(self) -> None:
        """Writes the lines waiting and says the frames left out at the very end of a
        node's output. Again at once after another call: nothing more."""
        with self._lock:
            self._write_waiting()
            out: list[str] = []
            for node, rank in list(self._folds):
                self._say_frames(out, node, rank)
            self._write(out)
            self._guarded(self._stream.flush)

    def _write_waiting(self) -> None:
        """Every line waiting, written at once."""
        out: list[str] = []
        while self._waiting:
            node, rank, text = self._waiting.popleft()
            if node == AS_WRITTEN:
                out.append(text)
                continue
            rank, text = self._summaries.setdefault(node, FailureSummary()).own(rank, text)
            if self._folds:  # a backtrace is being folded
                fold = self._folds.get((node, rank))
                if fold is not None and fold.frame.match(text):
                    fold.frames += 1
                    if fold.last is not None and fold.last.match(text):
                        self._say_frames(out, node, rank)  # its end: said in its place
                    continue
                self._say_frames(out, node, rank)
            shown = printable(text)
            # logsearch.where's prefix, written out: this runs for each of a job's lines
            out.append(f"[{node}/{rank}] {shown}\n" if rank is not None else f"[{node}] {shown}\n")
            if rank is None and _RENDEZVOUS_NOT_CLOSED.search(text):
                self.rendezvous_not_closed.add(node)
            if not self.full_logs:
                continue
            if _BACKTRACE_START.search(text):
                self._folds[(node, rank)] = _Fold(_BACKTRACE_FRAME, "C++ backtrace",
                                                  self.full_logs)
            elif rank is not None and text == ABORTED:
                # an aborted rank's (a hang's stop): the rest of faulthandler's dump
                self._folds[(node, rank)] = _Fold(DUMP_LINE, "its Python stack",
                                                  self.full_logs, last=DUMP_END)
            elif rank is None and text == TRACEBACK_START:
                self._folds[(node, rank)] = _Fold(_PYTHON_FRAME, "torchrun's own traceback",
                                                  self.full_logs)
        self._write(out)

    def _say_frames(self, out: list[str], node: str, rank: str | None) -> None:
        fold = self._folds.pop((node, rank), None)
        if fold is not None and fold.frames:
            out.append(f"{where(node, rank)} ({counted(fold.frames, 'line')} of {fold.what} "
                       f"left out: {fold.full_logs} prints them)\n")

    def _write(self, out: list[str]) -> None:
        if out:
            self._guarded(lambda: self._stream.write("".join(out)))
        if self._live:
            self._guarded(self._stream.flush)

    def _guarded(self, action: Callable[[], object]) -> None:
        if self._failed:
            return
        try:
            action()
        except BrokenPipeError:
            discard_writes(self._stream)
            raise OutputClosed(f"{self._stream.name}: its reader went away") from None
        except OSError as error:
            self._failed = True
            discard_writes(self._stream)
            with contextlib.suppress(OSError, ValueError):
                print(f"gpucluster: {self._stream.name}: {error.strerror or error}: the "
                      f"job's lines are no longer written there; the job goes on "
                      f"(gpucluster logs shows them)", file=self._notes or sys.stderr,
                      flush=True)


@dataclasses.dataclass
class _Fold:
    """A backtrace being folded: what its frames look like, what they are, the command
    that prints them (its job's, though the note comes after another attempt began), how
    many; the line that ends it, where it has one (else the rank's next other line)."""

    frame: re.Pattern[str]
    what: str
    full_logs: str
    frames: int = 0
    last: re.Pattern[str] | None = None
