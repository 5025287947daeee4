"""One attempt at running a job, as a value: start it, follow it, stop it.

`launch` runs one attempt; recovery (a loop that decides from classified failures
whether to try again, and where) drives several, each a fresh torchrun job.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpucluster.errors import GpuclusterError
from gpucluster.inventory import Inventory
from gpucluster.launch.control import stop
from gpucluster.launch.follow import SILENT_NODE_S, follow
from gpucluster.launch.jobs import JobRecord, JobStore
from gpucluster.launch.model import (
    DEFAULT_GRACE_S,
    JobOutcome,
    LaunchRequest,
    OutputCallback,
    StopResult,
)
from gpucluster.launch.start import launch
from gpucluster.remote.session import Session


@dataclass
class Attempt:
    """A job attempt on `inventory`'s hosts; `record` is set once it has started."""

    session: Session
    inventory: Inventory
    store: JobStore
    request: LaunchRequest
    record: JobRecord | None = None

    def start(self, on_phase: Callable[[str], None] | None = None) -> JobRecord:
        """Check, sync and start on every node (raises LaunchRefused on a finding)."""
        self.record = launch(self.session, self.inventory, self.store, self.request, on_phase)
        return self.record

    def follow(self, on_output: OutputCallback | None = None,
               grace_s: float = DEFAULT_GRACE_S,
               say: Callable[[str], None] | None = None,
               hang_timeout_s: float | None = None,
               node_timeout_s: float = SILENT_NODE_S, stop_lost: bool = True) -> JobOutcome:
        """Stream until every node's part has ended; the first failure (or a hang) stops
        it all."""
        return follow(self.session, self.inventory, self._started(), self.store, on_output,
                      live=True, fail_fast=True, stop_on_interrupt=True, grace_s=grace_s,
                      say=say, hang_timeout_s=hang_timeout_s,
                      node_timeout_s=node_timeout_s, stop_lost=stop_lost)

    def stop(self, grace_s: float = DEFAULT_GRACE_S,
             nodes: Sequence[str] | None = None) -> dict[str, StopResult]:
        return stop(self.session, self.inventory, self._started(), grace_s, nodes)

    def _started(self) -> JobRecord:
        if self.record is None:
            raise GpuclusterError("this job attempt has not been started")
        return self.record
