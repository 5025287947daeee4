"""`gpucluster prune`: forget ended jobs, on every node and here; a dry run unless --yes."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from gpucluster import hostrange
from gpucluster.cli.launch_cmd import job_store
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
from gpucluster.cli.views import prune as views
from gpucluster.errors import EXIT_FAILED
from gpucluster.wording import ago, counted, size

if TYPE_CHECKING:
    from gpucluster.launch.prune import JobPrune, PruneReport


def prune(
    inventory: InventoryOption = None,
    older_than: Annotated[str, typer.Option(
        "--older-than", metavar="AGE",
        help="Only jobs started longer ago: 7d, 12h, 30m; 0 for every ended job.")] = "7d",
    checkpoints: Annotated[bool, typer.Option(
        "--checkpoints", help="Remove the jobs' checkpoints too (kept by default).")] = False,
    yes: Annotated[bool, typer.Option(
        "--yes", "-y", help="Remove them; without it, only list and size them.")] = False,
    json_output: JsonOption = False,
    accept_new_host_keys: AcceptNewOption = False,
    ask_pass: AskPassOption = False,
    connect_timeout: ConnectTimeoutOption = None,
) -> None:
    """Forget jobs that ended: their logs and state on every node and their record here
    (--checkpoints: their checkpoints too). Lists what it would remove unless --yes; a
    running job, or one a node cannot vouch for, is never touched. Where Slurm is set up,
    the files Slurm jobs from export sbatch left on the nodes too, once Slurm no longer
    has the job and nothing was written there for AGE."""
    from gpucluster.launch import prune as core
    from gpucluster.slurm import prune as slurm_core
    from gpucluster.slurm.queue import set_up_from_here

    age_s = core.parse_age(older_than)
    older_than = core.age_words(older_than)
    loaded = load_inventory(inventory)
    store = job_store(loaded)
    with open_session(loaded, accept_new_host_keys, ask_pass, connect_timeout) as session:
        report = core.prune(session, loaded, store, age_s, checkpoints, yes)
        slurm = slurm_core.prune(session, loaded, age_s, checkpoints, yes) \
            if set_up_from_here(loaded) else None
    if json_output:
        common.print_json(stdout_console(), {**_payload(report, age_s, checkpoints),
                                             "slurm": views.payload(slurm)})
    else:
        _print(stderr_console(), report, older_than, checkpoints,
               slurm_found=slurm is not None and bool(slurm.jobs or slurm.skipped))
        if slurm is not None:
            views.print_report(stderr_console(), slurm, older_than, checkpoints, yes)
    if any(job.problem for job in report.jobs) or \
            (slurm is not None and any(job.problem for job in slurm.jobs)):
        raise typer.Exit(EXIT_FAILED)


def _print(err: Console, report: PruneReport, older_than: str, checkpoints: bool,
           slurm_found: bool = False) -> None:
    for job_id, why in report.skipped:
        err.print(f"job {job_id}: kept, {escape(why)}")
    if not report.jobs:
        if not slurm_found:  # else the Slurm jobs' lines say what there is
            err.print(f"no ended job started more than {escape(older_than)} ago")
        return
    now = time.time()
    for job in report.jobs:
        err.print(_job_line(job, now, report.removing))
    freed = sum(j.node_bytes for j in report.jobs if j.removed or not report.removing)
    here = sum(j.local_bytes for j in report.jobs if j.removed or not report.removing)
    tail = views.checkpoints_kept(sum(j.checkpoint_bytes for j in report.jobs
                                      if not j.remove_checkpoints), checkpoints)
    if report.removing:
        gone = [j for j in report.jobs if j.removed]
        err.print(f"removed {counted(len(gone), 'job')}: {size(freed)} on the nodes, "
                  f"{size(here)} here{tail}")
    else:
        err.print(f"would remove {counted(len(report.jobs), 'job')}: {size(freed)} on the "
                  f"nodes, {size(here)} here{tail}; --yes removes them")


def _job_line(job: JobPrune, now: float, removing: bool) -> str:
    record = job.record
    parts = views.files_on_nodes(job, "logs", "no files left on the nodes")
    if job.unlisted:
        parts.append(f"left on {hostrange.fold(job.unlisted)} (not in the inventory)")
    command = record.command()
    age = ago(now - record.started_at)
    return (f"job {record.id} ({escape(command[:40])}), started {age} ago: "
            f"{escape('; '.join(parts))}{views.outcome(job.problem, removing)}")


def _payload(report: PruneReport, age_s: float, checkpoints: bool) -> dict[str, Any]:
    return {
        "older_than_s": age_s, "checkpoints": checkpoints, "removing": report.removing,
        "jobs": [{"job": j.record.id, "removed": j.removed, "problem": j.problem or None,
                  "local_bytes": j.local_bytes, "checkpoints_removed":
                      j.remove_checkpoints and j.removed, "unlisted": j.unlisted,
                  "nodes": {n: {"job_bytes": f.job_bytes, "checkpoint_bytes":
                                f.checkpoint_bytes} for n, f in sorted(j.nodes.items())}}
                 for j in report.jobs],
        "skipped": [{"job": job_id, "why": why} for job_id, why in report.skipped],
    }
