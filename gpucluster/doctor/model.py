"""What checks produce and how they are registered."""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from gpucluster.doctor.gpu_selection import GpuSelection
    from gpucluster.doctor.probe import NodeFacts
    from gpucluster.doctor.rendezvous import Reachability
    from gpucluster.inventory import Host, Inventory
    from gpucluster.remote.result import HostFailure


class Status(enum.Enum):
    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"


@dataclass(frozen=True)
class CheckResult:
    """One check on one host."""

    name: str
    host: str
    status: Status
    message: str
    remedy: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Context:
    """Everything checks may look at: the inventory and every node's facts at once."""

    inventory: Inventory
    facts: Mapping[str, NodeFacts]  # hosts that answered the probe
    unreachable: Mapping[str, HostFailure]
    network: Mapping[str, Reachability]  # the second round: names and rendezvous port
    rendezvous_note: str | None = None  # why the port probe could not run, if it could not
    gpus: GpuSelection | None = None  # a job's GPUs (launch --gpus): the GPUs judged

    def answering(self) -> list[Host]:
        return [h for h in self.inventory.hosts if h.name in self.facts]


CheckFunction = Callable[[Context], list[CheckResult]]


@dataclass(frozen=True)
class CheckSpec:
    name: str
    category: str
    summary: str
    run: CheckFunction
    # The probe sections the check reads; None: it may read any (the whole probe runs).
    sections: frozenset[str] | None = None


REGISTRY: dict[str, CheckSpec] = {}


def check(name: str, category: str, summary: str, sections: tuple[str, ...] | None = None
          ) -> Callable[[CheckFunction], CheckFunction]:
    """Register a check; `doctor --list` shows `summary`. A check that names the probe
    `sections` it reads lets a run of only such checks (launch's readiness checks) send
    a probe of only those sections."""

    def register(function: CheckFunction) -> CheckFunction:
        REGISTRY[name] = CheckSpec(name, category, summary, function,
                                   frozenset(sections) if sections is not None else None)
        return function

    return register


def probe_sections(selected: Sequence[CheckSpec]) -> frozenset[str] | None:
    """What the probe must gather for these checks; None: all of it."""
    if not selected or any(spec.sections is None for spec in selected):
        return None
    return frozenset().union(*(spec.sections or () for spec in selected))


K = TypeVar("K", bound=Hashable)


def majority(values: Mapping[str, K]) -> K | None:
    """The value most hosts share; None on a tie for first place (no clear reference)."""
    counts = Counter(values.values()).most_common(2)
    if not counts or (len(counts) == 2 and counts[0][1] == counts[1][1]):
        return None
    return counts[0][0]


def parity(name: str, values: Mapping[str, Any], status_on_mismatch: Status, what: str,
           remedy: str) -> list[CheckResult]:
    """Same value everywhere: OK. Otherwise the hosts off the majority get the status
    (all of them when there is no majority), naming where the others stand."""
    from gpucluster import hostrange

    if not values:
        return []
    reference = majority(values)
    groups = hostrange.hosts_by((value, host) for host, value in values.items())
    spread = "; ".join(f"{v} on {hostrange.fold(hosts)}" for v, hosts in groups.items())
    results = []
    for host, value in values.items():
        if len(groups) == 1:
            same = f" (same on all {len(values)} nodes)" if len(values) > 1 else ""
            results.append(CheckResult(name, host, Status.OK, f"{what} {value}{same}"))
        elif value == reference:
            results.append(CheckResult(name, host, Status.OK,
                                       f"{what} {value} (the majority; {spread})"))
        else:
            results.append(CheckResult(name, host, status_on_mismatch,
                                       f"{what} {value} differs from the others: {spread}",
                                       remedy, {"values": {str(k): v for k, v in groups.items()}}))
    return results
