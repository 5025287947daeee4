"""Slurm's queue for the exporter: squeue on the controller host every few seconds, in a
thread of its own, so that a scrape reads the latest answer and never waits on Slurm."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from types import TracebackType

from gpucluster.errors import GpuclusterError
from gpucluster.inventory import Inventory
from gpucluster.remote.session import Session
from gpucluster.slurm.queue import QUERY_TIMEOUT_S, QueuedJob, queue

POLL_S = 5.0
# An answer older than this is not reported as Slurm's queue now (squeue hung, or the
# controller host is gone): gpucluster_slurm_up turns 0.
FRESH_S = 2 * POLL_S + QUERY_TIMEOUT_S


@dataclass(frozen=True)
class QueueReading:
    jobs: tuple[QueuedJob, ...]
    error: str  # "" when squeue answered
    at: float  # time.monotonic() of the answer

    def fresh(self, now: float) -> bool:
        return not self.error and now - self.at <= FRESH_S


class QueuePoller:
    """Reads Slurm's queue every `every_s` until closed; `latest` is None until the first
    answer (or failure) comes."""

    def __init__(self, session: Session, inventory: Inventory, every_s: float = POLL_S
                 ) -> None:
        self.session, self.inventory, self.every_s = session, inventory, every_s
        self.latest: QueueReading | None = None
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
            self._closed.wait(self.every_s)

    def read(self) -> QueueReading:
        try:
            jobs = queue(self.session, self.inventory)
        except GpuclusterError as error:
            return QueueReading((), str(error), time.monotonic())
        if jobs is None:
            return QueueReading((), "Slurm is not set up on the controller host",
                                time.monotonic())
        return QueueReading(tuple(jobs), "", time.monotonic())
