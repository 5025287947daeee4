"""The shapes of provisioning: a step's planned changes and each node's outcome."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from gpucluster.inventory import Host, Inventory
    from gpucluster.provision.logged import LoggedConnection
    from gpucluster.remote.result import FanoutResult


class StepSkipped(Exception):
    """Raised by `prepare` when the step does not apply to this cluster; says why."""


class Outcome(enum.Enum):
    CHANGED = "changed"
    OK = "already ok"
    PLANNED = "would change"  # --dry-run
    PASSED = "passed"  # a test step (smoke) that changes nothing
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Change:
    """One thing a step would change on a node; `detail` is a diff or the commands."""

    summary: str
    detail: str = ""


@dataclass(frozen=True)
class NodeResult:
    step: str
    host: str
    outcome: Outcome
    changes: tuple[Change, ...] = ()
    message: str = ""


@dataclass
class ProvisionContext:
    """What steps share during one run: the inventory, the state directory, and what
    `prepare` gathered across nodes (host keys, hostnames...)."""

    inventory: Inventory
    state_dir: Path
    dry_run: bool
    gathered: dict[str, dict[str, Any]] = field(default_factory=dict)


T = TypeVar("T")


class Each(Protocol):
    """Fan a task out over every node (or `hosts`) with logged connections."""

    def __call__(self, task: Callable[[Host, LoggedConnection], T],
                 hosts: Sequence[Host] | None = None) -> FanoutResult[T]: ...



def hostnames(context: ProvisionContext, each: Each) -> dict[str, str]:
    """Each node's real hostname, asked once per run whichever step needs it first."""
    if "hostnames" not in context.gathered:
        result = each(lambda _host, connection: connection.run("hostname", timeout=30).stdout)
        context.gathered["hostnames"] = {h: out.strip() for h, out in result.values.items()}
    return context.gathered["hostnames"]


class Step(Protocol):
    """check -> plan -> apply -> re-check, per node; `prepare` once for the cluster."""

    name: str
    summary: str

    def prepare(self, context: ProvisionContext, each: Each) -> None:
        """Gather what the step needs from every node at once (`each(task)` fans out)."""
        ...

    def check(self, context: ProvisionContext, host: Host,
              connection: LoggedConnection) -> list[Change]:
        """What would change on this node; empty when it is already right."""
        ...

    def apply(self, context: ProvisionContext, host: Host, connection: LoggedConnection,
              changes: list[Change]) -> None: ...
