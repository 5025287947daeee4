"""Run doctor: probe every node once (in parallel), probe the network once, then run the
selected checks over all facts together."""

from __future__ import annotations

import secrets
import shlex
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from gpucluster import hostrange
from gpucluster.doctor import checks as _register_checks  # noqa: F401 - fills REGISTRY
from gpucluster.doctor.checks.ssh_mesh import SECTION as SSH_MESH
from gpucluster.doctor.checks.ssh_mesh import ring_peer
from gpucluster.doctor.gpu_selection import GpuSelection
from gpucluster.doctor.model import (
    REGISTRY,
    CheckResult,
    CheckSpec,
    Context,
    Status,
    probe_sections,
)
from gpucluster.doctor.probe import NodeFacts, ProbeSteps, parse_facts, render_probe
from gpucluster.doctor.rendezvous import (
    MESH_PORTS,
    Reachability,
    head_listener,
    mesh_argument,
    resolve_round,
)
from gpucluster.inventory import Inventory
from gpucluster.remote.connection import Connection, password_line
from gpucluster.remote.result import CommandResult, FailureKind, HostFailure, RemoteError
from gpucluster.remote.session import Session
from gpucluster.reports import Section
from gpucluster.selection import select

DEFAULT_PROBE_TIMEOUT_S = 60.0
SUDO_READERS = frozenset({"sudo", "xid"})  # the checks that use --ask-sudo-pass's password


@dataclass(frozen=True)
class DoctorReport:
    """Every result, plus the facts behind the cross-node summary."""

    hosts: tuple[str, ...]
    checks: tuple[str, ...]
    results: tuple[CheckResult, ...]
    summary: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    duration_s: float = 0.0
    sections: dict[str, dict[str, Section]] = field(default_factory=dict)  # raw, per node
    unreachable: dict[str, HostFailure] = field(default_factory=dict)  # no facts from these

    def worst(self, strict: bool) -> Status:
        statuses = {r.status for r in self.results}
        if Status.FAIL in statuses or (strict and Status.WARN in statuses):
            return Status.FAIL
        return Status.WARN if Status.WARN in statuses else Status.OK


def select_checks(only: Sequence[str] | None, skip: Sequence[str] | None) -> list[CheckSpec]:
    """--only / --skip, in the order doctor shows checks."""
    return [REGISTRY[n] for n in select(list(REGISTRY), only, skip, "check")]


def run_doctor(session: Session, inventory: Inventory, selected: Sequence[CheckSpec],
               probe_timeout: float = DEFAULT_PROBE_TIMEOUT_S,
               on_node: Callable[[str], None] | None = None,
               rider: str = "",
               probe_via: Callable[[str], Connection] | None = None,
               gpus: GpuSelection | None = None) -> DoctorReport:
    """All facts in one round trip per node (plus the head's test listener), then every
    selected check. `rider`: shell code that rides along in the same round trip (in a
    subshell, after the probe), printing report sections of its own; each node's are in
    the report's `sections`. `probe_via(host)`: where the probe runs instead of a
    command of its own on the session's connection (launch's waiting shells). `gpus`:
    the GPUs a job would use; the GPU checks judge those alone."""
    started = time.monotonic()
    # The password only goes where a check reads through sudo (and is tried once there).
    reads_as_root = bool(SUDO_READERS & {s.name for s in selected})
    password = session.options.sudo_password if reads_as_root else None
    sections = probe_sections(selected)
    script = render_probe(inventory, sections, password is not None) + (
        f"\n( {rider}\n)\n" if rider else "")
    stdin = None if password is None else password_line(password)
    head = inventory.head.name
    names = {s.name for s in selected}
    test_port = "rendezvous-port" in names
    low, high = MESH_PORTS  # drawn anew each run: a port busy on a node once is not again
    mesh_port = low + secrets.randbelow(high - low) if sections is None or "peers" in sections \
        else None
    tries_ssh = sections is None or SSH_MESH in sections

    def probe(connection: Connection) -> NodeFacts:
        connection.connect()  # so the clock reading is not skewed by the handshake
        connect = test_port and connection.host != head
        clock_seen: list[float] = []

        steps = ProbeSteps()

        def on_line(stream: str, line: str) -> None:
            if not clock_seen and line.strip()[:1].isdigit():  # the clock is printed first
                clock_seen.append(time.time())
            steps.see(stream, line)

        mesh = mesh_argument(inventory, connection.host, mesh_port) if mesh_port else None
        ssh_peer = ring_peer(inventory, connection.host) if tries_ssh else None
        exports = ("export GPC_CONNECT=1; " if connect else "") + (
            f"export GPC_MESH={shlex.quote(mesh)}; " if mesh else "") + (
            f"export GPC_SSH_PEER={shlex.quote(ssh_peer)}; " if ssh_peer else "")
        sent_at = time.time()
        try:
            result: CommandResult = connection.run(exports + script, timeout=probe_timeout,
                                                   stdin=stdin, on_line=on_line)
        except RemoteError as error:
            if error.kind is FailureKind.TIMED_OUT:
                raise RemoteError(error.kind, steps.timeout_message(probe_timeout)) from None
            raise
        return parse_facts(result.stdout, sent_at, clock_seen[0] if clock_seen else None)

    indices = gpus.indices if gpus is not None else ""
    listening = head_listener(session, inventory, indices) if test_port else nullcontext(None)
    with listening as listener:
        gathered = session.map(
            inventory.hosts, probe if probe_via is None else lambda c: probe(probe_via(c.host)),
            on_done=(lambda host, _: on_node(host)) if on_node else None)
    facts = dict(gathered.values)
    note = listener.note if listener is not None else "not tested (--skip)"
    context = Context(inventory, facts, dict(gathered.failures),
                      _network(session, inventory, facts), note, gpus)
    results: list[CheckResult] = []
    for spec in selected:
        results.extend(_run_check(spec, context))
    order = {h.name: i for i, h in enumerate(inventory.hosts)}
    results.sort(key=lambda r: order.get(r.host, len(order)))
    return DoctorReport(
        hosts=tuple(h.name for h in inventory.hosts),
        checks=tuple(s.name for s in selected),
        results=tuple(results),
        summary=cross_node_summary(context),
        facts={name: fact_summary(f) for name, f in facts.items()},
        sections={name: f.sections for name, f in facts.items()},
        duration_s=time.monotonic() - started,
        unreachable=dict(context.unreachable),
    )


def _network(session: Session, inventory: Inventory, facts: dict[str, NodeFacts]
             ) -> dict[str, Reachability]:
    """Per node: names resolved and the port state. Hostnames that are not inventory names
    (the probe could not know them) are resolved in one more small round trip."""
    known = {h.name for h in inventory.hosts}
    unknown = sorted({f.hostname for f in facts.values() if f.hostname} - known)
    answering = [h for h in inventory.hosts if h.name in facts]
    extra = resolve_round(session, answering, unknown) if unknown else {}
    return {name: Reachability({**f.resolved, **extra.get(name, {})}, f.port)
            for name, f in facts.items()}


def _run_check(spec: CheckSpec, context: Context) -> list[CheckResult]:
    """A check that raises becomes FAIL on every node, with the error as details."""
    try:
        results = spec.run(context)
    except Exception as error:  # one broken check must not sink the report
        return [CheckResult(spec.name, h.name, Status.FAIL, "the check itself failed",
                            "report this as a gpucluster bug", {"error": repr(error)})
                for h in context.answering()]
    if spec.name != "ssh":  # unreachable hosts are reported once, by the ssh check
        results += [CheckResult(spec.name, name, Status.SKIP,
                                f"not checked: {failure.kind.value} (see the ssh check)")
                    for name, failure in context.unreachable.items()]
    return results


def cross_node_summary(context: Context) -> dict[str, dict[str, list[str]]]:
    """Fact -> value -> hosts, for the facts whose parity matters most."""
    probes: dict[str, Callable[[NodeFacts], str | None]] = {
        "driver": lambda f: f.versions.driver if f.gpus else None,
        "CUDA (driver)": lambda f: f.versions.cuda if f.gpus else None,
        "GPU": lambda f: (None if "nvidia_smi_path" not in f.sections else  # not probed
                          f"{len(f.gpus)} x {f.gpus[0].name}" if f.gpus else
                          ("none" if not f.has_nvidia_smi else "driver failure")),
        "torch": lambda f: f.torch.version if f.torch and f.torch.version else None,
        "torch CUDA": lambda f: (f.torch.cuda or "cpu") if f.torch and f.torch.version else None,
        "NCCL": lambda f: f.torch.nccl if f.torch and f.torch.nccl else None,
    }
    summary: dict[str, dict[str, list[str]]] = {}
    for label, read in probes.items():
        read_values = ((read(context.facts[h.name]), h.name) for h in context.answering())
        values = hostrange.hosts_by((v, name) for v, name in read_values if v is not None)
        if values:
            summary[label] = values
    return summary


def fold_summary(values: dict[str, list[str]]) -> str:
    return ", ".join(f"{value} on {hostrange.fold(hosts)}" for value, hosts in values.items())


def fact_summary(facts: NodeFacts) -> dict[str, Any]:
    """The facts --json reports per host (what checks judged, in plain values)."""
    torch = facts.torch
    return {
        "hostname": facts.hostname,
        "driver": facts.versions.driver,
        "cuda_driver": facts.versions.cuda,
        "gpus": [{"index": g.index, "name": g.name, "memory_total_mib": g.memory_total_mib,
                  "bus_id": g.bus_id} for g in facts.gpus],
        "torch": torch.version if torch else None,
        "torch_cuda": torch.cuda if torch else None,
        "nccl": torch.nccl if torch else None,
        "interfaces": dict(facts.interfaces),
        "mtus": dict(facts.mtus),
        "infiniband": {p: {"state": s, "rate": r} for p, (s, r) in facts.infiniband.items()},
        "shm_bytes": facts.df_size_bytes("shm"),
        "work_dir_free_bytes": facts.df_available_bytes("disk"),
        "clock_offset_s": None if facts.clock_offset_s is None else round(
            facts.clock_offset_s, 3),
        "runtimes": facts.runtimes,
        "login_s": None if facts.login_s is None else round(facts.login_s, 3),
    }
