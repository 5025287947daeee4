"""How an attempt of `launch --recover` ended: classified from its outcome (node lost,
hang, worker error, interrupt), with its progress, quarantines and a hang's stacks; and
the line `jobs` shows for it."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpucluster.launch.hang_stacks import StackGroup
from gpucluster.launch.known_causes import error_lines
from gpucluster.launch.model import JobOutcome
from gpucluster.wording import ranks_named


@dataclass(frozen=True)
class AttemptReport:
    number: int
    job: str
    nodes: tuple[str, ...]
    ended: str  # succeeded, node lost, hang, worker error, interrupted
    detail: str
    duration_s: float
    quarantined: dict[str, str] = field(default_factory=dict)  # node -> why
    # Of those, the ones out of reach, where the attempt could not be stopped: its ranks
    # may go on there (a network cut, not a dead node) until `gpucluster stop JOB`.
    out_of_reach: tuple[str, ...] = ()
    stacks: tuple[StackGroup, ...] = ()  # a hang's: where each rank was (hang_stacks)
    # From the nodes' heartbeats: the first and last step the script wrote (None when it
    # writes none), and when the first and last progress arrived (controller clock).
    first_step: int | None = None
    last_step: int | None = None
    first_progress_at: float | None = None
    last_progress_at: float | None = None

    def resumed(self, previous: AttemptReport) -> tuple[int | None, int | None, float | None]:
        """After `previous` failed: the step this attempt resumed at, the steps done
        again, and the time without progress between the two."""
        redone = (max(previous.last_step - self.first_step + 1, 0)
                  if previous.last_step is not None and self.first_step is not None else None)
        lost = (self.first_progress_at - previous.last_progress_at
                if self.first_progress_at is not None and previous.last_progress_at is not None
                else None)
        return self.first_step, redone, lost


def classify(outcome: JobOutcome) -> tuple[str, str]:
    """What ended the attempt, and in a few words how."""
    if outcome.interrupted:
        return "interrupted", "Ctrl-C"
    if outcome.hang:
        return "hang", outcome.hang
    failure = outcome.first_failure
    if failure is None:
        return ("succeeded", "") if outcome.exit_code == 0 else ("worker error", "failed")
    if failure.state.state in ("unreachable", "lost"):
        return "node lost", f"{failure.node}: {failure.state.state}" + (
            f" ({failure.state.detail})" if failure.state.detail else "")
    if failure.state.state == "leftover":  # its torchrun, not a rank, ended first
        return "worker error", f"{failure.node}: {failure.state.leftover_cause}"
    rank = f"rank {failure.rank}" if failure.rank is not None else "a rank"
    last = signature(outcome)[1]
    if failure.killing_signal:  # it printed no error of its own: its last line is not one
        how = f"killed by {failure.killing_signal}" + (f"; its last line: {last}" if last
                                                      else "")
        return "worker error", f"{rank} on {failure.node}: {how}"
    return "worker error", f"{rank} on {failure.node}: {last or 'failed'}"


def signature(outcome: JobOutcome) -> tuple[int | None, str]:
    """A worker error's rank and last error line: the same line on two attempts in a row
    is the script's bug, not a node's."""
    failure = outcome.first_failure
    if failure is None:
        return None, ""
    lines = [line.strip() for line in (failure.rank_tail or failure.tail) if line.strip()]
    # The exception's line (a rank's stdout may still arrive after its traceback, even
    # thousands of lines after), without torch's "[rankN]: " prefix, so that the same
    # error on another rank reads the same.
    errors = error_lines(failure.rank_error) or error_lines(lines)
    return failure.rank, errors[-1] if errors else (lines[-1] if lines else "")


def failure_note(report: AttemptReport) -> str:
    """The attempt's end in a line, as `jobs` shows it once the attempt has ended; a
    hang's with the ranks apart from the rest (elsewhere, or without a stack)."""
    if report.ended == "worker error":
        return report.detail
    note = f"{report.ended}: {report.detail}"
    for group in report.stacks[1:3]:  # the first is where most ranks were
        without = "no stack" + (f" ({group.why})" if group.why else "")
        note += f"; {ranks_named(group.ranks)}: {group.where or without}"
    return note
