"""`launch --recover`, attached (the attempts streamed here, a summary at the end) or
detached (the same, run by a supervisor process)."""

from __future__ import annotations

import dataclasses
import sys

import typer
from rich.console import Console
from rich.markup import escape

from gpucluster import hostrange
from gpucluster.cli.options import stdout_console
from gpucluster.cli.views import common
from gpucluster.cli.views import launch as view
from gpucluster.cli.views.line_printer import LinePrinter
from gpucluster.errors import EXIT_FAILED, GpuclusterError
from gpucluster.inventory import Inventory
from gpucluster.launch.jobs import JobRecord, JobStore
from gpucluster.launch.logsearch import LogFilter
from gpucluster.launch.model import LaunchRequest
from gpucluster.launch.recover import RecoveryPolicy, RecoveryResult
from gpucluster.remote.session import Session
from gpucluster.state import new_log
from gpucluster.wording import counted


def policy(inventory: Inventory, recover: bool, grace_s: float, min_nodes: int | None,
           max_recoveries: int | None, hang_timeout_s: float | None,
           node_timeout_s: float | None) -> RecoveryPolicy | None:
    """--recover's policy from its options (None: not on the command line), or None
    without --recover. Refused, since each would be silently ignored: those options
    without --recover, and a --min-nodes the first attempt cannot have."""
    given = {"--min-nodes": min_nodes, "--max-recoveries": max_recoveries,
             "--hang-timeout": hang_timeout_s, "--node-timeout": node_timeout_s}
    named = [option for option, value in given.items() if value is not None]
    if not recover:
        if named:
            raise GpuclusterError(f"{', '.join(named)}: only with --recover (fix: add "
                                  f"--recover, or drop {'them' if len(named) > 1 else 'it'})")
        return None
    first = [h.name for h in inventory.hosts if not h.spare]
    default = RecoveryPolicy(grace_s=grace_s)
    wanted = default.min_nodes if min_nodes is None else min_nodes
    if wanted > len(first):
        raise GpuclusterError(f"--min-nodes {wanted}: the first attempt has "
                              f"{counted(len(first), 'node')}, {hostrange.fold(first)} "
                              f"(spares join only in place of a lost node) (fix: --min-nodes "
                              f"{len(first)} or fewer, or select more hosts)")
    return dataclasses.replace(
        default, min_nodes=wanted,
        max_recoveries=default.max_recoveries if max_recoveries is None else max_recoveries,
        hang_timeout_s=default.hang_timeout_s if hang_timeout_s is None else hang_timeout_s,
        node_timeout_s=default.node_timeout_s if node_timeout_s is None else node_timeout_s)


def supervise(store: JobStore, err: Console, json_output: bool) -> None:
    """launch -d --recover: the attached launch --recover, as a supervisor process."""
    from gpucluster.launch import supervisor

    log = new_log(store.root.parent / "supervisors")
    process = supervisor.spawn([sys.executable, "-m", "gpucluster",
                                *supervisor.supervised_argv(sys.argv[1:])], log)
    job = supervisor.wait_for_first_job(process, log)
    if json_output:
        common.print_json(stdout_console(), {"job": job, "detached": True,
                                             "supervisor": process.pid, "log": str(log)})
    else:
        stdout_console().print(job)
    err.print(f"job {job} started under a recovery supervisor (pid {process.pid}, log "
              f"{log}); gpucluster jobs lists its attempts; gpucluster stop ends it")


def run(session: Session, inventory: Inventory, store: JobStore, request: LaunchRequest,
        policy: RecoveryPolicy, err: Console, json_output: bool,
        shown: LogFilter | None = None) -> None:
    """The attempts, streamed (those lines `shown` keeps, when given); the run's summary
    at the end; the exit code is the last attempt's (non-zero when recovery gave up).
    Each attempt's job dir names this process, so `stop` from another shell ends the
    run, not just the attempt."""
    import os

    from gpucluster.cli.views.recovery import print_recovery, recovery_payload
    from gpucluster.launch import supervisor
    from gpucluster.launch.model import LaunchRefused
    from gpucluster.launch.recover import recover

    lines = LinePrinter(sys.stderr if json_output else sys.stdout,
                        full_logs="gpucluster logs JOB")

    def attempt_started(record: JobRecord) -> None:
        supervisor.record_pid(store, record.id, os.getpid())
        lines.full_logs = f"gpucluster logs {record.id}"  # the lines now are its
        # The outcome shown is the last attempt's: an earlier one's warnings are not its.
        lines.rendezvous_not_closed.clear()

    try:
        result = recover(session, inventory, store, request, policy,
                         on_attempt=attempt_started,
                         say=lambda text: err.print(f"[bold yellow]gpucluster: "
                                                    f"{escape(text)}[/]"),
                         on_output=lines if shown is None else shown.passing(lines),
                         on_phase=common.phase_printer(err))
    except LaunchRefused as refused:
        view.print_refusal(err, refused, stdout_console() if json_output else None)
        raise typer.Exit(EXIT_FAILED) from None
    finally:
        lines.finish()
    _note_failures(store, result)
    if result.outcome is not None:
        view.print_outcome(err, result.outcome, store, lines.rendezvous_not_closed)
    print_recovery(err, result)
    if json_output:
        common.print_json(stdout_console(), recovery_payload(result, store))
    raise typer.Exit(result.exit_code)


def _note_failures(store: JobStore, result: RecoveryResult) -> None:
    """Each failed attempt's line for `jobs` was noted as it ended (recover); the last
    one's worker error is noted again as a plain launch's, with its likely cause."""
    from gpucluster.launch.failure import in_a_line

    last = result.outcome.first_failure if result.outcome is not None else None
    if result.attempts and result.attempts[-1].ended == "worker error" and last is not None:
        store.note_failure(result.attempts[-1].job, in_a_line(last))
