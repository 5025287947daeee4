"""Slurm's queue for the exporter and top: squeue on the controller host every few
seconds, in a thread of its own, so that a scrape or a frame reads the latest answer and
never waits on Slurm."""

from __future__ import annotations

import threading
import time
from collections import Counter
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from types import TracebackType

from gpucluster.errors import GpuclusterError
from gpucluster.inventory import Inventory
from gpucluster.remote.session import Session
from gpucluster.slurm.queue import QUERY_TIMEOUT_S, QueuedJob, queue, set_up_from_here

POLL_S = 5.0
# An answer older than this is not reported as Slurm's queue now.
FRESH_S = 2 * POLL_S + QUERY_TIMEOUT_S


@dataclass(frozen=True)
class QueueReading:
    jobs: tuple[QueuedJob, ...]
    error: str  # "" when squeue answered
    at: float  # time.monotonic() of the answer
    set_up: bool = True  # False: the controller host has no Slurm (nothing to show)

    def by_state(self) -> dict[str, int]:
        """Jobs per state, PENDING and RUNNING always there (0 when none)."""
        counted = Counter({"PENDING": 0, "RUNNING": 0})
        counted.update(job.state for job in self.jobs)
        return dict(sorted(counted.items()))


NOT_YET = "no answer from squeue yet"


class QueuePoller:
    """Reads Slurm's queue every `every_s` until closed; `latest` is None until the first
    answer (or failure) comes."""

    def __init__(self, session: Session, inventory: Inventory, every_s: float = POLL_S
                 ) -> None:
        self.session, self.inventory, self.every_s = session, inventory, every_s
        self.latest: QueueReading | None = None
        self._answered = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="slurm-queue")

    def __enter__(self) -> QueuePoller:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._closed.set()  # a squeue in flight ends with the session's close

    def _run(self) -> None:
        while not self._closed.is_set():
            self.latest = self.read()
            self._answered.set()
            self._closed.wait(self.every_s)

    def wait_first(self, timeout_s: float) -> None:
        self._answered.wait(timeout_s)

    def reading(self) -> QueueReading:
        """The latest answer; in its place an error where there is none yet, or where it
        is too old to be the queue now (squeue hung, the controller host gone)."""
        latest, now = self.latest, time.monotonic()
        if latest is None:
            return QueueReading((), NOT_YET, now)
        if not latest.error and now - latest.at > FRESH_S:
            return QueueReading((), f"squeue's last answer is {now - latest.at:.0f}s old",
                                latest.at)
        return latest

    def read(self) -> QueueReading:
        try:
            jobs = queue(self.session, self.inventory)
        except GpuclusterError as error:
            return QueueReading((), str(error), time.monotonic())
        if jobs is None:
            return QueueReading((), "", time.monotonic(), set_up=False)
        return QueueReading(tuple(jobs), "", time.monotonic())


def polled_where_set_up(session: Session, inventory: Inventory
                        ) -> AbstractContextManager[QueuePoller | None]:
    """A poller of Slurm's queue where Slurm is set up from here (the inventory's `slurm:`,
    or provision's munge key beside it), else None: top and the exporter ask nothing."""
    if set_up_from_here(inventory):
        return QueuePoller(session, inventory)
    return nullcontext()
