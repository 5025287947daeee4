"""Run provision: the parity gate, then each step on every node in parallel
(check -> plan -> apply -> re-check), never stopping because one node failed."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from gpucluster import reports
from gpucluster.doctor.model import REGISTRY, CheckResult, Status
from gpucluster.doctor.runner import run_doctor
from gpucluster.errors import GpuclusterError
from gpucluster.inventory import Host, Inventory, SlurmSettings
from gpucluster.phases import PhaseTimes
from gpucluster.provision import prefetch
from gpucluster.provision.logged import CommandLog, LoggedConnection
from gpucluster.provision.model import (
    Change,
    NodeResult,
    Outcome,
    Progress,
    ProvisionContext,
    Step,
    StepSkipped,
)
from gpucluster.provision.root_gate import root_refusal
from gpucluster.provision.steps_firewall import FirewallStep
from gpucluster.provision.steps_hosts import HostsStep
from gpucluster.provision.steps_image import ImageStep
from gpucluster.provision.steps_slurm import SlurmStep
from gpucluster.provision.steps_ssh_mesh import SshMeshStep
from gpucluster.remote.connection import Connection
from gpucluster.remote.result import CommandResult, FailureKind, FanoutResult, HostFailure
from gpucluster.remote.session import Session
from gpucluster.reports import Section
from gpucluster.selection import select
from gpucluster.slurm.queue import enabled_in, set_up_from_here
from gpucluster.state import exclusive, new_log, state_dir_for
from gpucluster.wording import counted

T = TypeVar("T")
PARITY_CHECKS = ("driver", "cuda-driver", "gpu-count", "gpu-model", "torch", "torch-build",
                 "torch-cuda", "nccl")
STEP_TYPES: tuple[type[Step], ...] = (SshMeshStep, HostsStep, FirewallStep, ImageStep,
                                      SlurmStep)
STEP_NAMES = ("parity", *(s.name for s in STEP_TYPES), "smoke")
OPTIONAL_STEPS = ("slurm",)  # in a run only with --with, or when the inventory asks
UNDOABLE = ("ssh-mesh", "hosts", "firewall", "slurm")


@dataclass(frozen=True)
class ProvisionReport:
    hosts: tuple[str, ...]
    steps: tuple[str, ...]
    results: tuple[NodeResult, ...]
    gate: tuple[CheckResult, ...] = ()
    gate_blocked: bool = False
    verified: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)  # by step
    log: Path | None = None
    duration_s: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # seconds: parity, each step...

    @property
    def mesh(self) -> dict[str, dict[str, str]]:
        """The SSH mesh's pair matrix: source -> target -> ok or why not."""
        return self.verified.get(SshMeshStep.name, {})

    @property
    def failed(self) -> bool:
        """A node failed, the gate stopped the run, or a verification found a pair that
        does not work (the mesh's files can be right while a login still fails)."""
        return self.gate_blocked or any(r.outcome is Outcome.FAILED for r in self.results) \
            or any(verdict != "ok" for matrix in self.verified.values()
                   for row in matrix.values() for verdict in row.values())


def select_steps(only: Sequence[str] | None, skip: Sequence[str] | None,
                 with_: Sequence[str] | None = None, inventory: Inventory | None = None
                 ) -> list[str]:
    """--only / --skip / --with, in the order the steps run. An optional step (slurm)
    runs when named by --with or --only, or when the inventory enables it."""
    unknown = [n for n in with_ or [] if n not in OPTIONAL_STEPS]
    if unknown:
        raise GpuclusterError(f"--with {', '.join(unknown)}: only {', '.join(OPTIONAL_STEPS)}"
                              f" can be added")
    wanted = set(with_ or [])
    if inventory is not None and enabled_in(inventory):
        wanted.add("slurm")
    chosen = select(STEP_NAMES, only, skip, "step")
    return [s for s in chosen if s not in OPTIONAL_STEPS or s in wanted or only]


def slurm_settings(inventory: Inventory, steps: Sequence[str]) -> SlurmSettings | None:
    """Slurm's settings when Slurm is part of the cluster: its step runs, the inventory
    enables it, or an earlier `provision --with slurm` set it up and no `--undo slurm`
    took it down. The firewall then keeps its ports open in any run: a plain provision
    after `--with slurm` used to close them under the running daemons."""
    if "slurm" in steps or set_up_from_here(inventory):
        return inventory.slurm or SlurmSettings()
    return None


# Failures to connect that the same run would only meet again, after the same wait.
_DOWN = (FailureKind.UNREACHABLE, FailureKind.AUTH_FAILED, FailureKind.HOST_KEY_UNKNOWN,
         FailureKind.HOST_KEY_CHANGED)


class _Run:
    """One provision run: the logged connections and the fan-out helper steps use."""

    def __init__(self, session: Session, inventory: Inventory, log: CommandLog,
                 down: dict[str, HostFailure]) -> None:
        self.session = session
        self.inventory = inventory
        self.logged: dict[str, LoggedConnection] = {}
        self.log = log
        self.primed: dict[str, dict[prefetch.Read, CommandResult]] = {}  # read ahead
        self.writes_change: list[prefetch.Read] | None = None  # of the step under way
        self.down = down  # the context's: shared with the steps

    def mark_down(self, failures: Mapping[str, HostFailure]) -> None:
        for name, failure in failures.items():
            if failure.kind in _DOWN:
                self.down[name] = failure
                self.log.write(name, f"{failure.kind.value}: {failure.message} (not tried "
                                     f"again in this run)")

    def connection(self, connection: Connection) -> LoggedConnection:
        if connection.host not in self.logged:
            self.logged[connection.host] = LoggedConnection(
                connection, self.log, self.primed.pop(connection.host, None))
            self.logged[connection.host].writes_change = self.writes_change
        return self.logged[connection.host]

    def start(self, step: Step, context: ProvisionContext) -> None:
        """What `step`'s writes may change of the reads ahead: its own, or every one."""
        self.writes_change = step.reads(context) if step.changes_only_own_reads else None
        for logged in self.logged.values():
            logged.writes_change = self.writes_change

    def prime(self, reads: list[prefetch.Read],
              sections: Mapping[str, Mapping[str, Section]]) -> None:
        for host, found in sections.items():
            self.primed[host] = prefetch.parse(host, found, reads)

    def each(self, task: Callable[[Host, LoggedConnection], T],
             hosts: Sequence[Host] | None = None) -> FanoutResult[T]:
        targets = list(hosts if hosts is not None else self.inventory.hosts)
        by_name = {h.name: h for h in targets}
        down = {h.name: self.down[h.name] for h in targets if h.name in self.down}
        done = self.session.map([h for h in targets if h.name not in down],
                                lambda c: task(by_name[c.host], self.connection(c)))
        return FanoutResult(tuple(by_name), done.values, {**done.failures, **down})


def provision(session: Session, inventory: Inventory, steps: Sequence[str], dry_run: bool,
              force: bool, on_step: Callable[[str], None] | None = None,
              on_image_progress: Progress | None = None,
              verify: bool = False) -> ProvisionReport:
    """Every selected step on every node; one provision at a time per inventory. A step's
    cluster-wide verification (the mesh's every pair) runs when the step changed a node,
    or with `verify`: a run that finds everything right does not pay for it again."""
    phases = PhaseTimes(on_step)
    with exclusive(state_dir_for(inventory), "provision"):
        report = _provision(session, inventory, steps, dry_run, force, phases,
                            on_image_progress, verify)
    return dataclasses.replace(report, phases=phases.durations())


def _provision(session: Session, inventory: Inventory, steps: Sequence[str], dry_run: bool,
               force: bool, on_step: Callable[[str], None] | None,
               on_image_progress: Progress | None, verify: bool) -> ProvisionReport:
    started = time.monotonic()
    state_dir = state_dir_for(inventory)
    log = CommandLog(new_log(state_dir / "logs", "provision-"))
    context = ProvisionContext(inventory, state_dir, dry_run, on_progress=on_image_progress,
                               slurm=slurm_settings(inventory, steps),
                               sudo_password=session.options.sudo_password)
    run = _Run(session, inventory, log, context.down)
    selected = [kind() for kind in STEP_TYPES if kind.name in steps]  # fresh per run
    reads = prefetch.unique([r for step in selected for r in step.reads(context)
                             # a sudo that asks a password is answered only by a command
                             # of its own (its stdin): such reads run then, not ahead
                             if not (r[1] and session.options.sudo_password is not None)])
    rider = prefetch.script(reads) if reads else ""
    gate: list[CheckResult] = []
    if "parity" in steps:
        if on_step:
            on_step("parity")
        report = run_doctor(session, inventory, [REGISTRY[n] for n in PARITY_CHECKS],
                            rider=rider)
        run.prime(reads, report.sections)
        run.mark_down(report.unreachable)
        gate = [r for r in report.results if r.status is Status.FAIL]
        if gate and not force:
            return ProvisionReport(tuple(h.name for h in inventory.hosts), tuple(steps), (),
                                   tuple(gate), True, log=log.path,
                                   duration_s=time.monotonic() - started)
    elif rider:
        ahead = session.map(inventory.hosts, lambda c: c.run(rider, timeout=120).stdout)
        run.prime(reads, {h: reports.sections(out) for h, out in ahead.values.items()})
        run.mark_down(ahead.failures)
    refusal = root_refusal(session, inventory,
                            [s.name for s in selected if s.needs_root(context)])
    if refusal:
        raise GpuclusterError(refusal)
    results: list[NodeResult] = []
    verified: dict[str, dict[str, dict[str, str]]] = {}
    for step in selected:
        if on_step:
            on_step(step.name)
        run.start(step, context)
        done = _run_step(step, run, context)
        results.extend(done)
        worth_it = verify or any(r.outcome is not Outcome.OK for r in done)
        if not dry_run and worth_it and (found := step.verify(context, run.each)):
            verified[step.name] = found
    if "smoke" in steps:
        if on_step:
            on_step("smoke")
        failed = sorted({r.host for r in results if r.outcome is Outcome.FAILED})
        if failed:  # every node must join; a smoke test would only wait for the missing
            results.extend(NodeResult("smoke", h.name, Outcome.SKIPPED,
                                      message=f"not run: {', '.join(failed)} failed earlier")
                           for h in inventory.hosts)
        else:
            results.extend(_smoke(session, inventory, dry_run))
    return ProvisionReport(tuple(h.name for h in inventory.hosts), tuple(steps),
                           tuple(results), tuple(gate), False, verified, log.path,
                           time.monotonic() - started)


def _smoke(session: Session, inventory: Inventory, dry_run: bool) -> list[NodeResult]:
    """The last step: the all-reduce smoke test across every node, through torchrun."""
    from gpucluster.smoke.runner import run_smoke

    if dry_run:
        return [NodeResult("smoke", h.name, Outcome.SKIPPED, message="runs after a real "
                           "provision") for h in inventory.hosts]
    report = run_smoke(session, inventory, min_busbw_gbps=inventory.smoke.min_busbw_gbps)
    results = []
    for host in inventory.hosts:
        problem = report.node_errors.get(host.name) or (
            "; ".join(report.problems) if report.problems else None)
        if problem:
            results.append(NodeResult("smoke", host.name, Outcome.FAILED, message=problem))
        else:
            peak = max((e["busbw_gbps"] for e in report.sweep), default=0.0)
            note = f"slow: {report.slow[host.name]}" if host.name in report.slow else \
                f"{report.backend} all-reduce correct, peak busbw {peak:.2f} Gbit/s"
            results.append(NodeResult("smoke", host.name, Outcome.PASSED, message=note))
    return results


def _run_step(step: Step, run: _Run, context: ProvisionContext) -> list[NodeResult]:
    try:
        step.prepare(context, run.each)
    except StepSkipped as reason:
        return [NodeResult(step.name, h.name, Outcome.SKIPPED, message=str(reason))
                for h in context.inventory.hosts]
    except GpuclusterError as error:
        return [NodeResult(step.name, h.name, Outcome.FAILED, message=str(error))
                for h in context.inventory.hosts]

    cluster_wide = step.cluster_wide

    def converge(host: Host, connection: LoggedConnection) -> NodeResult:
        try:
            changes = step.check(context, host, connection)
            if not changes:
                return NodeResult(step.name, host.name, Outcome.OK,
                                  message=step.note(context, host))
            if context.dry_run or cluster_wide:
                return NodeResult(step.name, host.name, Outcome.PLANNED, tuple(changes),
                                  step.note(context, host))
            step.apply(context, host, connection, changes)
            return recheck(host, connection, changes)
        except GpuclusterError as error:
            return NodeResult(step.name, host.name, Outcome.FAILED, message=str(error))

    def recheck(host: Host, connection: LoggedConnection, changes: list[Change]
                ) -> NodeResult:
        left = step.check(context, host, connection)
        if left:
            return NodeResult(step.name, host.name, Outcome.FAILED, tuple(left),
                              "still differs after applying")
        return NodeResult(step.name, host.name, Outcome.CHANGED, tuple(changes),
                          step.note(context, host))

    outcomes = _collect(step.name, run.each(converge))
    if cluster_wide and not context.dry_run:
        planned = {r.host: r for r in outcomes.values() if r.outcome is Outcome.PLANNED}
        targets = [h for h in context.inventory.hosts if h.name in planned]
        if targets:
            verified = step.apply_all(context, run.each, targets,
                                      {h.name: run.logged[h.name] for h in targets})
            for host in targets:
                problem = verified.get(host.name)
                outcomes[host.name] = NodeResult(
                    step.name, host.name, Outcome.FAILED if problem else Outcome.CHANGED,
                    planned[host.name].changes, problem or "")
    order = {h.name: i for i, h in enumerate(context.inventory.hosts)}
    return sorted(outcomes.values(), key=lambda r: order[r.host])


def _collect(step: str, result: FanoutResult[NodeResult]) -> dict[str, NodeResult]:
    """Per-host results, with hosts that could not be reached as FAILED."""
    outcomes = dict(result.values)
    for name, failure in result.failures.items():
        outcomes[name] = NodeResult(step, name, Outcome.FAILED,
                                    message=f"{failure.kind.value}: {failure.message}")
    return outcomes


def undo(session: Session, inventory: Inventory, what: str) -> list[NodeResult]:
    """`--undo STEP`: remove exactly what the step added on every node (the firewall's
    rules; the mesh's key, line and blocks; the hosts block; Slurm's daemons and files)."""
    if what not in UNDOABLE:
        raise GpuclusterError(f"--undo {what}: not a step that can be undone (fix: one of "
                              f"{', '.join(UNDOABLE)})")
    state_dir = state_dir_for(inventory)
    context = ProvisionContext(inventory, state_dir, dry_run=False)
    step = next(kind() for kind in STEP_TYPES if kind.name == what)
    refusal = root_refusal(session, inventory, [what] if step.needs_root(context) else [])
    if refusal:
        raise GpuclusterError(refusal)
    log = CommandLog(new_log(state_dir / "logs", "undo-"))
    run = _Run(session, inventory, log, context.down)

    def remove(host: Host, connection: LoggedConnection) -> NodeResult:
        try:
            undone = step.undo(context, host, connection)
        except GpuclusterError as error:
            return NodeResult(what, host.name, Outcome.FAILED, message=str(error))
        outcome = Outcome.CHANGED if undone else Outcome.OK
        return NodeResult(what, host.name, outcome, message=counted(len(undone), *step.undone)
                          if undone else f"nothing of the {what} step's to remove")

    result = run.each(remove)
    failed = [NodeResult(what, n, Outcome.FAILED, message=f.message)
              for n, f in result.failures.items()]
    if not failed and all(r.outcome is not Outcome.FAILED for r in result.values.values()):
        step.forget(context)
    order = {h.name: i for i, h in enumerate(inventory.hosts)}
    return sorted([*result.values.values(), *failed], key=lambda r: order[r.host])
