"""`gpucluster stop`: end a job on every node (TERM, then KILL) and confirm that nothing
of it is left; a Slurm job through scancel."""

from __future__ import annotations

import threading

import typer

from gpucluster import hostrange
from gpucluster.cli.launch_cmd import GraceOption, JobArgument, job_store
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

# A stop still under way this long is said to be waiting (its workers saving on TERM)
STOP_NOTICE_AFTER_S = 2.0


def stop(
    job: JobArgument = None,
    inventory: InventoryOption = None,
    grace: GraceOption = 10.0,
    json_output: JsonOption = False,
    accept_new_host_keys: AcceptNewOption = False,
    ask_pass: AskPassOption = False,
    connect_timeout: ConnectTimeoutOption = None,
) -> None:
    """End a job on every node: TERM, then KILL after the grace period; confirms that
    nothing of it is left. JOB slurm-ID cancels a Slurm job (scancel) and waits for Slurm
    to end it."""
    from gpucluster.launch import supervisor
    from gpucluster.launch.control import running_besides
    from gpucluster.launch.control import stop as stop_job
    from gpucluster.slurm.queue import slurm_job

    loaded = load_inventory(inventory)
    slurm_id = slurm_job(job)
    if slurm_id is not None:
        from gpucluster.cli import slurm_jobs

        with open_session(loaded, accept_new_host_keys, ask_pass, connect_timeout) as session:
            slurm_jobs.cancel(session, loaded, slurm_id, json_output)
        return
    store = job_store(loaded)
    record = store.load(job)
    watcher = supervisor.supervisor_of(store, record.id)
    if watcher is not None:  # first, or it would start the next attempt
        if not supervisor.end(watcher, grace + 60):
            raise GpuclusterError(f"the recovery supervisor of job {record.id} (pid "
                                  f"{watcher}) did not end (fix: kill {watcher}, then stop "
                                  f"again)")
        stderr_console().print(f"gpucluster: ended the recovery supervisor (pid {watcher})")
    with open_session(loaded, accept_new_host_keys, ask_pass, connect_timeout) as session:
        # Said where the stop takes a while (its workers may save until the grace is
        # over); started once any password has been asked for
        waiting = threading.Timer(STOP_NOTICE_AFTER_S, stderr_console().print, [
            f"gpucluster: job {record.id}: waiting for it to end on "
            f"{hostrange.fold(record.hosts)} (TERM sent to its torchrun; KILL to what is "
            f"left {grace:g} s after it)"])
        waiting.daemon = True
        waiting.start()
        try:
            results = stop_job(session, loaded, record, grace)
        finally:
            waiting.cancel()
        # No job named, and the newest had already ended: the job meant may be an older
        # one that still runs (the line names it; it is stopped only by its id).
        besides = None if job not in (None, "last") or watcher is not None or any(
            r.found for r in results.values()) else running_besides(session, loaded, store,
                                                                     record.id)
    if json_output:
        common.print_json(stdout_console(), view.stop_payload(record, results))
    else:
        view.print_stopped(stdout_console(), record, results, by_supervisor=watcher is not None,
                           still_running=besides)
    if not view.stopped_cleanly(results):
        raise typer.Exit(EXIT_FAILED)
