"""`launch --recover`: run a job as attempts, and after a failure decide from the
controller, which sees every node, whether and where to try again.

Each attempt is a fresh torchrun job (its own id, so its own rendezvous) on the nodes
still healthy; all attempts of a run share one checkpoint dir per node, from which the
script resumes. A failure is classified (node lost, hang, worker error, interrupt);
every node of the attempt is re-checked with doctor's health checks, and one that fails
them is quarantined for the rest of the run.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpucluster import hostrange
from gpucluster.doctor import gpu_selection
from gpucluster.doctor.gpu_selection import GpuSelection
from gpucluster.inventory import Host, Inventory
from gpucluster.launch import hang_stacks
from gpucluster.launch.attempt import Attempt
from gpucluster.launch.attempt_report import (
    AttemptReport,
    classify,
    failure_note,
    signature,
)
from gpucluster.launch.jobs import JobRecord, JobStore
from gpucluster.launch.known_causes import mended_by_restart
from gpucluster.launch.model import (
    DEFAULT_GRACE_S,
    JobOutcome,
    LaunchRefused,
    LaunchRequest,
    OutputCallback,
)
from gpucluster.launch.node_health import (
    START_HEALTH_CHECKS,
    copy_checkpoints,
    health_findings,
    take_spares,
)
from gpucluster.launch.node_scripts import HEARTBEAT_S
from gpucluster.launch.start import job_env
from gpucluster.remote.session import Session
from gpucluster.wording import counted

BACKOFF_S = (2.0, 5.0, 10.0)  # before attempt 2, 3, 4 and later
# Five missed heartbeats: quicker than a plain launch's SILENT_NODE_S, since a node
# wrongly taken for lost costs a relaunch here, not the job.
RECOVER_SILENT_NODE_S = 5 * HEARTBEAT_S
COLLECTIVE_TIMEOUT = "GPUCLUSTER_COLLECTIVE_TIMEOUT_S"


@dataclass(frozen=True)
class RecoveryPolicy:
    min_nodes: int = 1
    max_recoveries: int = 3
    hang_timeout_s: float | None = 300.0
    node_timeout_s: float = RECOVER_SILENT_NODE_S
    grace_s: float = DEFAULT_GRACE_S


def watchdog_env(policy: RecoveryPolicy) -> dict[str, str]:
    """Set on every rank of a recovering NCCL job, so that a rank blocked on a dead peer
    ends in bounded time even when no controller watches: torch tears a rank down on a
    watchdog timeout or error (3, its default, stated), the monitor thread ends one whose
    watchdog is itself stuck in a CUDA/NCCL call, and the script is told a collective
    timeout for `init_process_group` (torch has no variable for it). Twice the hang
    timeout: the controller's own hang detection comes first."""
    bound = str(max(int(2 * (policy.hang_timeout_s or 300.0)), 60))
    return {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "TORCH_NCCL_ENABLE_MONITORING": "1",
            "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": bound, COLLECTIVE_TIMEOUT: bound}


@dataclass
class RecoveryResult:
    run: str
    attempts: list[AttemptReport] = field(default_factory=list)
    quarantined: dict[str, str] = field(default_factory=dict)
    set_aside: dict[str, str] = field(default_factory=dict)  # of those, before attempt 1
    gave_up: str = ""  # why no further attempt was made, when the last one failed
    outcome: JobOutcome | None = None  # the last attempt's

    @property
    def exit_code(self) -> int:
        if self.outcome is None:
            return 1
        return self.outcome.exit_code if not self.gave_up else max(self.outcome.exit_code, 1)


def recover(session: Session, inventory: Inventory, store: JobStore, request: LaunchRequest,
            policy: RecoveryPolicy, say: Callable[[str], None],
            on_output: OutputCallback | None = None,
            on_phase: Callable[[str], None] | None = None,
            on_attempt: Callable[[JobRecord], None] | None = None) -> RecoveryResult:
    """Attempts until one succeeds, Ctrl-C, or no recovery is left (the bound, too few
    healthy nodes, or the same worker error twice). Spares (`spare: true`) stay out
    until a node is quarantined; each then takes a lost node's place, with the run's
    newest checkpoint copied to it over the mesh."""
    healthy, spares = ([h for h in inventory.hosts if not h.spare],
                       [h for h in inventory.hosts if h.spare])
    wanted = len(healthy)
    result = RecoveryResult(run="")
    # The inventory's env and --env win over the watchdog's defaults.
    request = dataclasses.replace(request, env={
        **{n: v for n, v in watchdog_env(policy).items() if n not in inventory.cluster.env},
        **request.env})
    chosen = gpu_selection.from_env(job_env(inventory, request.env))  # launch --gpus
    previous_error: tuple[int | None, str] | None = None
    for number in range(1, policy.max_recoveries + 2):
        nodes = inventory.restricted_to(healthy)
        attempt_request = dataclasses.replace(request, attempt=number,
                                              run=result.run or None)
        started = time.monotonic()
        try:
            record = Attempt(session, nodes, store, attempt_request).start(on_phase)
        except LaunchRefused as refused:
            if number > 1:
                result.gave_up = f"attempt {number} could not start: {refused}: " + \
                    "; ".join(f"{f.host} {f.name}: {f.message}" for f in refused.findings[:3])
                return result
            # Nothing ran. Nodes that are down or whose GPUs are sick are set aside, as
            # they would be after a failure, and spares take their place; anything else
            # (or a second refusal) goes to the caller, who shows the findings.
            healthy = _set_aside_at_start(session, inventory, healthy, spares, refused,
                                          policy, result, say, chosen)
            nodes, record = _start_again(session, inventory, healthy, store,
                                         attempt_request, on_phase)
        result.run = result.run or record.id
        if on_attempt is not None:
            on_attempt(record)
        say(f"attempt {number}: job {record.id} on {hostrange.fold(record.hosts)} "
            f"({counted(len(record.hosts), 'node')})")
        attempt = Attempt(session, nodes, store, attempt_request, record)
        # A lost node is not waited for (its connect timeout) when stopping the others:
        # the health checks below re-check it, and stop it if it answers after all.
        outcome = attempt.follow(on_output, policy.grace_s, say=say,
                                 hang_timeout_s=policy.hang_timeout_s,
                                 node_timeout_s=policy.node_timeout_s, stop_lost=False)
        result.outcome = outcome
        ended, detail = classify(outcome)
        report = _with_progress(AttemptReport(number, record.id, tuple(record.hosts), ended,
                                              detail, time.monotonic() - started), outcome)
        if ended in ("succeeded", "interrupted"):
            result.attempts.append(report)
            return result
        report = _ended(report, outcome, store, say)
        error = signature(outcome) if ended == "worker error" else None
        result.gave_up = _the_scripts_fault(outcome, error, previous_error)
        if result.gave_up:
            result.attempts.append(report)
            return result
        previous_error = error
        try:
            sick, out_of_reach = _quarantine(session, attempt, nodes, policy, say, chosen)
            result.attempts.append(dataclasses.replace(report, quarantined=sick,
                                                       out_of_reach=out_of_reach))
            result.quarantined.update(sick)
            healthy = [h for h in healthy if h.name not in sick]
            joined = take_spares(session, inventory, spares, wanted - len(healthy), say,
                                 healthy, chosen)
            if joined and healthy:  # a survivor has the run's checkpoints
                copy_checkpoints(session, inventory, record.checkpoint_dir, healthy[0],
                                 joined, say)
                healthy = [h for h in inventory.hosts if h in healthy or h in joined]
            result.gave_up = _no_recovery(number, len(healthy), policy)
            if result.gave_up:
                return result
            pause = BACKOFF_S[min(number - 1, len(BACKOFF_S) - 1)]
            say(f"recovering: attempt {number + 1} on "
                f"{hostrange.fold([h.name for h in healthy])} in {pause:g}s")
            time.sleep(pause)
        except KeyboardInterrupt:  # between attempts: nothing of the job runs
            result.outcome = dataclasses.replace(outcome, interrupted=True)
            return result
    return result


def _ended(report: AttemptReport, outcome: JobOutcome, store: JobStore,
           say: Callable[[str], None]) -> AttemptReport:
    """A failed attempt's end, said, and noted for `jobs` while the run goes on; a
    hang's with where each rank was (its stop's)."""
    say(f"attempt {report.number} ended: {report.ended}: {report.detail}")
    if report.ended == "hang":
        report = dataclasses.replace(report, stacks=hang_stacks.read(outcome.stopped))
        kept = hang_stacks.write(store.directory(report.job),
                                 hang_stacks.kept_dumps(outcome.stopped))
        for line in hang_stacks.said(report.stacks, kept):
            say(line)
    store.note_failure(report.job, failure_note(report))
    return report


def _start_again(session: Session, inventory: Inventory, healthy: list[Host],
                 store: JobStore, request: LaunchRequest,
                 on_phase: Callable[[str], None] | None) -> tuple[Inventory, JobRecord]:
    nodes = inventory.restricted_to(healthy)
    return nodes, Attempt(session, nodes, store, request).start(on_phase)


def _set_aside_at_start(session: Session, inventory: Inventory, healthy: list[Host],
                        spares: list[Host], refused: LaunchRefused, policy: RecoveryPolicy,
                        result: RecoveryResult, say: Callable[[str], None],
                        chosen: GpuSelection | None) -> list[Host]:
    """The first attempt's nodes once those the refusal named, all of them failing a
    start health check, are set aside and spares have joined; else `refused` again."""
    named = {f.host for f in refused.findings}
    if named >= {h.name for h in healthy}:  # the whole cluster's to mend, not a node's
        raise refused
    # Checked with the others (peer-ports needs peers to connect from), judged alone.
    sick = health_findings(session, inventory.restricted_to(healthy), START_HEALTH_CHECKS,
                           judged=named, gpus=chosen)
    # Every node named is set aside, but one named only for a lossy pair: the other
    # node of the pair going mends it.
    lossy_only = {f.host for f in refused.findings if f.name == "path-mtu"} - \
        {f.host for f in refused.findings if f.name != "path-mtu"}
    if not sick or not set(sick) <= named or not named - set(sick) <= lossy_only:
        raise refused
    for node, why in sick.items():
        say(f"{node} set aside before the first attempt: {why}")
    result.quarantined.update(sick)
    result.set_aside.update(sick)
    left = [h for h in healthy if h.name not in sick]
    joined = take_spares(session, inventory, spares, len(healthy) - len(left), say, left,
                         chosen)
    left = [h for h in inventory.hosts if h in left or h in joined]
    if len(left) < policy.min_nodes:
        raise LaunchRefused(f"{counted(len(left), 'healthy node')} left once "
                            f"{hostrange.fold(list(sick))} set aside, fewer than "
                            f"--min-nodes {policy.min_nodes}", refused.findings)
    return left


def _the_scripts_fault(outcome: JobOutcome, error: tuple[int | None, str] | None,
                       previous: tuple[int | None, str] | None) -> str:
    """Why no attempt on these nodes can end otherwise, or nothing: a worker error of a
    known cause no restart mends, or the same error line as the attempt before (the
    same failure: when every rank raises at once, which of them torchrun reports first
    changes from one attempt to the next)."""
    if error is None:
        return ""
    cause = outcome.first_failure.cause if outcome.first_failure else None
    if cause is not None and not mended_by_restart(cause):
        return f"{cause.what}, which no restart mends (rank {error[0]}: {error[1]})"
    if error[1] and previous is not None and error[1] == previous[1]:
        return (f"the script fails the same way on two attempts in a row (rank {error[0]}: "
                f"{error[1]}): that is its bug, not a node's")
    return ""


def _no_recovery(number: int, healthy: int, policy: RecoveryPolicy) -> str:
    """Why attempt `number` is the last, or nothing."""
    if number > policy.max_recoveries:
        return f"no recovery left (--max-recoveries {policy.max_recoveries})"
    if healthy < policy.min_nodes:
        return f"{healthy} healthy nodes left, fewer than --min-nodes {policy.min_nodes}"
    return ""


def _with_progress(report: AttemptReport, outcome: JobOutcome) -> AttemptReport:
    """The attempt's progress over all its nodes: its resume step is the lowest first
    step, how far it got the highest last step."""
    beats = outcome.progress.values()
    return dataclasses.replace(
        report,
        first_step=min((p.first_step for p in beats if p.first_step is not None), default=None),
        last_step=max((p.last_step for p in beats if p.last_step is not None), default=None),
        first_progress_at=min((p.first_at for p in beats), default=None),
        last_progress_at=max((p.last_at for p in beats), default=None))


def _quarantine(session: Session, attempt: Attempt, nodes: Inventory, policy: RecoveryPolicy,
                say: Callable[[str], None], chosen: GpuSelection | None
                ) -> tuple[dict[str, str], tuple[str, ...]]:
    """The attempt's nodes that fail the health checks, each with why, and those of them
    out of reach. One that still answers is stopped there too: nothing of the attempt
    may go on; on one out of reach it may, and the user is told how to end it."""
    job = attempt.record.id if attempt.record is not None else "JOB"
    sick = health_findings(session, nodes, gpus=chosen)
    answering = [n for n, why in sick.items() if not why.startswith("ssh:")]
    if answering:
        attempt.stop(policy.grace_s, answering)
    out_of_reach = tuple(n for n in sick if n not in answering)
    for node, why in sick.items():
        say(f"{node} quarantined for the rest of the run: {why}"
            + (f"; {left_running(job, node)}" if node in out_of_reach else ""))
    return sick, out_of_reach


def left_running(job: str, nodes: str) -> str:
    """What to do about an attempt that nodes out of reach may still run."""
    return (f"job {job} may still run on {nodes}, out of reach: gpucluster stop {job} ends "
            f"it there once it answers")
