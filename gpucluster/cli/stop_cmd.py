"""`gpucluster stop`: end a job on every node (TERM, then KILL) and confirm that nothing
of it is left; a Slurm job through scancel."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpucluster import hostrange
from gpucluster.cli.launch_cmd import GraceOption, job_store
from gpucluster.cli.options import (
    AcceptNewOption,
    AskPassOption,
    ConnectTimeoutOption,
    InventoryOption,
    JsonOption,
    load_inventory,
    open_session,
    stderr_console,
    stdout_console,
)
from gpucluster.cli.views import common
from gpucluster.cli.views import launch as view
from gpucluster.errors import EXIT_FAILED, GpuclusterError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpucluster.inventory import Inventory
    from gpucluster.launch.jobs import JobRecord, JobStore
    from gpucluster.launch.model import StopResult
    from gpucluster.remote.session import Session

# A stop still under way this long is said to be waiting (its workers saving on TERM)
STOP_NOTICE_AFTER_S = 2.0


def stop(
    jobs: Annotated[list[str] | None, typer.Argument(
        metavar="[JOB]...", help="Job ids, unique parts of them, or 'last' (the default: "
                                 "the newest job); slurm-ID for a Slurm job.")] = None,
    every: Annotated[bool, typer.Option(
        "--all", help="Every job launched from here that still has processes on a node "
                      "(as gpucluster jobs lists them).")] = False,
    stacks: Annotated[bool, typer.Option(
        "--stacks", help="For a job that hangs: abort each rank first, so that it writes "
                         "its Python stack into its log (faulthandler), then say where "
                         "each rank was.")] = False,
    inventory: InventoryOption = None,
    grace: GraceOption = 10.0,
    json_output: JsonOption = False,
    accept_new_host_keys: AcceptNewOption = False,
    ask_pass: AskPassOption = False,
    connect_timeout: ConnectTimeoutOption = None,
) -> None:
    """End a job on every node: TERM, then KILL after the grace period; confirms that
    nothing of it is left. Several JOBs are stopped at once; --all stops every job of
    ours still running. JOB slurm-ID cancels a Slurm job (scancel) and waits
    for Slurm to end it. --stacks says where each rank was as it stopped."""
    from gpucluster.launch.control import running_besides
    from gpucluster.slurm.queue import slurm_job

    if every and jobs:
        raise GpuclusterError("--all with JOBs named: which is meant? (fix: gpucluster stop "
                              "--all, or gpucluster stop JOB...)")
    several = every or len(jobs or []) > 1
    if several and any(slurm_job(job) is not None for job in jobs or []):
        raise GpuclusterError("a Slurm job among several: Slurm's jobs are stopped one at a "
                              "time (fix: gpucluster stop slurm-ID on its own)")
    if stacks and any(slurm_job(job) is not None for job in jobs or []):
        raise GpuclusterError("--stacks: Slurm's jobs are cancelled by Slurm, which sends "
                              "no abort (fix: gpucluster stacks slurm-ID says where each "
                              "rank is; then gpucluster stop slurm-ID)")
    loaded = load_inventory(inventory)
    store = job_store(loaded)
    with open_session(loaded, accept_new_host_keys, ask_pass, connect_timeout) as session:
        named: list[str | None] = [*running_besides(session, loaded, store, "")] if every \
            else [*jobs] if jobs else [None]
        if not named:
            stderr_console().print("no job launched from here has processes on the nodes: "
                                   "nothing to stop")
        def stop_one(job: str | None) -> _Stopped:
            return _stop_one(session, loaded, store, job, grace, json_output,
                             alone=not several, stacks=stacks)

        # Several at once, each in its own grace period; their lines in the order named
        stopped = []
        with ThreadPoolExecutor(max_workers=max(len(named), 1)) as pool:
            for done in pool.map(stop_one, named):
                done.show()
                stopped.append(done)
    if json_output and several:
        common.print_json(stdout_console(), {"jobs": [done.payload for done in stopped]})
    if not all(done.clean for done in stopped):
        raise typer.Exit(EXIT_FAILED)


@dataclass(frozen=True)
class _Stopped:
    payload: dict[str, Any]  # its JSON
    clean: bool  # every node confirmed that nothing of it is left
    show: Callable[[], None] = lambda: None  # says it


def _stop_one(session: Session, loaded: Inventory, store: JobStore, job: str | None,
              grace: float, json_output: bool, alone: bool, stacks: bool = False
              ) -> _Stopped:
    """One job's stop, and how to say it (as JSON only when `alone`). `stacks`: each
    rank aborted first, and where they were said after."""
    from gpucluster.launch import supervisor
    from gpucluster.launch.control import running_besides
    from gpucluster.launch.control import stop as stop_job
    from gpucluster.slurm.queue import slurm_job

    slurm_id = slurm_job(job)
    if slurm_id is not None:  # alone: refused among several
        from gpucluster.cli import slurm_jobs

        slurm_jobs.cancel(session, loaded, slurm_id, json_output)
        return _Stopped({"job": f"slurm-{slurm_id}"}, True)
    record = store.load(job)
    watcher = supervisor.supervisor_of(store, record.id)
    if watcher is not None:  # first, or it would start the next attempt
        if not supervisor.end(watcher, grace + 60):
            raise GpuclusterError(f"the recovery supervisor of job {record.id} (pid "
                                  f"{watcher}) did not end (fix: kill {watcher}, then stop "
                                  f"again)")
        stderr_console().print(f"gpucluster: ended the recovery supervisor (pid {watcher})")
    # Said where the stop takes a while (its workers may save until the grace is over)
    waiting = threading.Timer(STOP_NOTICE_AFTER_S, stderr_console().print, [
        f"gpucluster: job {record.id}: waiting for it to end on "
        f"{hostrange.fold(record.hosts)} ("
        f"{'each rank aborted for its stack, then ' if stacks else ''}TERM sent to its "
        f"torchrun; KILL to what is left {grace:g} s after it)"])
    waiting.daemon = True
    waiting.start()
    try:
        results = stop_job(session, loaded, record, grace, dump_stacks=stacks)
    finally:
        waiting.cancel()
    # No job named, and the newest had already ended: the job meant may be an older one
    # that still runs (the line names it; it is stopped only by its id).
    besides = None if job not in (None, "last") or watcher is not None or any(
        r.found for r in results.values()) else running_besides(session, loaded, store,
                                                                 record.id)
    payload = view.stop_payload(record, results)
    said = _where_ranks_were(store, record, results) if stacks else None
    if said is not None:
        payload["stacks"] = said[0]

    def show() -> None:
        if json_output and alone:
            common.print_json(stdout_console(), payload)
        elif not json_output:
            view.print_stopped(stdout_console(), record, results,
                               by_supervisor=watcher is not None, still_running=besides)
            for line in said[1] if said is not None else []:
                stdout_console().print(line, markup=False, highlight=False)
    return _Stopped(payload, view.stopped_cleanly(results), show)


def _where_ranks_were(store: JobStore, record: JobRecord,
                      results: Mapping[str, StopResult]
                      ) -> tuple[list[dict[str, Any]], list[str]]:
    """Where each rank was as the stop aborted it: as JSON, and in lines."""
    from gpucluster.launch import hang_stacks

    if not any(result.found for result in results.values()):
        return [], ["--stacks: nothing of the job ran any more: no rank to ask"]
    groups = hang_stacks.read(results)
    if not groups:
        return [], ["--stacks: no rank wrote its stack (a job whose env turns "
                    "PYTHONFAULTHANDLER off, or one started by an older gpucluster, which did "
                    "not turn it on; py-spy on the nodes reads them before the abort)"]
    kept = hang_stacks.write(store.directory(record.id), hang_stacks.kept_dumps(results))
    return hang_stacks.payload(groups), hang_stacks.said(
        groups, kept, "where each rank was when it was stopped")
