"""The shapes of provisioning: a step's planned changes and each node's outcome."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from gpucluster.inventory import Host, Inventory, SlurmSettings
    from gpucluster.provision.logged import LoggedConnection
    from gpucluster.remote.result import FanoutResult, HostFailure


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


Progress = Callable[[str, int, bool], None]  # node, bytes received, finished


@dataclass
class ProvisionContext:
    """What steps share during one run: the inventory, the state directory, what
    `prepare` gathered across nodes (host keys, hostnames...), and where long transfers
    report their progress."""

    inventory: Inventory
    state_dir: Path
    dry_run: bool
    gathered: dict[str, Any] = field(default_factory=dict)
    on_progress: Progress | None = None
    slurm: SlurmSettings | None = None  # Slurm is part of this cluster: its step, its ports
    # Nodes that did not answer this run's first round: no step connects to them again
    # (each would wait its connect timeout), every step fails them with this.
    down: dict[str, HostFailure] = field(default_factory=dict)
    # --ask-sudo-pass: for sudo inside a step's own scripts (the relay's load); never shown
    sudo_password: str | None = field(default=None, repr=False)


T = TypeVar("T")


class Each(Protocol):
    """Fan a task out over every node (or `hosts`) with logged connections."""

    def __call__(self, task: Callable[[Host, LoggedConnection], T],
                 hosts: Sequence[Host] | None = None) -> FanoutResult[T]: ...



HOSTNAME_COMMAND = "hostname"


def hostnames(context: ProvisionContext, each: Each) -> dict[str, str]:
    """Each node's real hostname, asked once per run whichever step needs it first, and
    vetted (provision/hostnames.py): what is not usable is left out, with the reason in
    gathered["hostname_notes"]."""
    if "hostnames" not in context.gathered:
        from gpucluster.provision.hostnames import vet

        result = each(lambda _host, connection: connection.run(HOSTNAME_COMMAND,
                                                               timeout=30).stdout)
        reported = {h: out.strip() for h, out in result.values.items()}
        usable, dropped = vet(reported, [h.name for h in context.inventory.hosts])
        context.gathered["hostnames"] = usable
        context.gathered["hostname_notes"] = dropped
    found: dict[str, str] = context.gathered["hostnames"]
    return found


class Step:
    """check -> plan -> apply -> re-check, per node; `prepare` once for the cluster.

    Capabilities a step declares rather than the runner guessing from its type:
    `cluster_wide` steps are checked per node, then applied once to every node that
    needs it (`apply_all`: the image relay); a step may `verify` the whole cluster after
    applying (the SSH mesh tries every pair) and report what it found."""

    name: str
    summary: str
    cluster_wide = False
    # Whether what the step writes on a node is read by no other step (its own files,
    # its own rules): provision then keeps the other steps' reads ahead across its
    # writes, rather than reading them again.
    changes_only_own_reads = False

    def needs_root(self, context: ProvisionContext) -> bool:
        """Whether the step changes what only root may (then a non-root node user must
        have passwordless sudo, checked before any step changes anything)."""
        return False

    def reads(self, context: ProvisionContext) -> list[tuple[str, bool]]:
        """The read-only commands (and whether under sudo) the step will run on every
        node, exactly as it runs them: provision reads them all ahead in one round trip
        (provision/prefetch.py)."""
        return []

    def prepare(self, context: ProvisionContext, each: Each) -> None:
        """Gather what the step needs from every node at once (`each(task)` fans out)."""

    def check(self, context: ProvisionContext, host: Host,
              connection: LoggedConnection) -> list[Change]:
        """What would change on this node; empty when it is already right."""
        raise NotImplementedError

    def apply(self, context: ProvisionContext, host: Host, connection: LoggedConnection,
              changes: list[Change]) -> None:
        """Make this node right (steps that are not cluster-wide)."""
        raise NotImplementedError

    def apply_all(self, context: ProvisionContext, each: Each, targets: list[Host],
                  connections: dict[str, LoggedConnection]) -> dict[str, str | None]:
        """Cluster-wide steps: make every target right at once; per node None when it
        verified, else what went wrong."""
        raise NotImplementedError

    def verify(self, context: ProvisionContext, each: Each) -> dict[str, dict[str, str]]:
        """After applying: a cluster-wide verification to report (empty: none)."""
        return {}

    # What `--undo` says it did, counted: undo's list holds one item per unit.
    undone = ("file cleaned", "files cleaned")

    def undo(self, context: ProvisionContext, host: Host,
             connection: LoggedConnection) -> list[str]:
        """`--undo`: remove from this node exactly what the step added; what was done."""
        raise NotImplementedError

    def forget(self, context: ProvisionContext) -> None:
        """Once `--undo` succeeded on every node: what the controller keeps of the step."""

    def note(self, context: ProvisionContext, host: Host) -> str:
        """Something the user should know about this node's result (empty: nothing)."""
        return ""
