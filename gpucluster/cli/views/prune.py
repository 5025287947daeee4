"""`gpucluster prune`'s wording shared by its two kinds of jobs, and its lines for
Slurm's jobs (the files export sbatch jobs left on the nodes), after gpucluster's own
jobs; and their JSON."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from rich.markup import escape

from gpucluster import hostrange
from gpucluster.wording import ago, counted, size

if TYPE_CHECKING:
    from rich.console import Console

    from gpucluster.slurm.prune import SlurmJobPrune, SlurmPruneReport


class _Files(Protocol):
    @property
    def job_bytes(self) -> int | None: ...


class _Pruned(Protocol):
    """A job prune lists: ours (launch.prune.JobPrune) or Slurm's (SlurmJobPrune)."""

    @property
    def nodes(self) -> Mapping[str, _Files]: ...
    @property
    def job_bytes(self) -> int: ...
    @property
    def checkpoint_bytes(self) -> int: ...
    @property
    def remove_checkpoints(self) -> bool: ...


def files_on_nodes(job: _Pruned, what: str, nothing: str) -> list[str]:
    """"logs 96 KiB on node[1-3]", "checkpoints 1.9 MiB kept"."""
    present = sorted(n for n, f in job.nodes.items() if f.job_bytes is not None)
    parts = [f"{what} {size(job.job_bytes)} on {hostrange.fold(present)}" if present
             else nothing]
    if job.checkpoint_bytes:
        parts.append(f"checkpoints {size(job.checkpoint_bytes)}"
                     + ("" if job.remove_checkpoints else " kept"))
    return parts


def outcome(problem: str, removing: bool) -> str:
    if problem:
        return f" [bold red]not removed: {escape(problem)}[/]"
    return " [green]removed[/]" if removing else ""


def checkpoints_kept(kept: int, checkpoints: bool) -> str:
    return f"; checkpoints kept: {size(kept)} (--checkpoints removes them)" \
        if kept and not checkpoints else ""


def print_report(err: Console, report: SlurmPruneReport, older_than: str, checkpoints: bool,
                 removing: bool) -> None:
    for job_id, why in report.skipped:
        err.print(f"Slurm job {job_id}: files kept, {escape(why)}")
    if not report.jobs:
        return
    now = time.time()
    for job in report.jobs:
        err.print(_line(job, now, removing))
    done = [j for j in report.jobs if j.removed or not removing]
    freed = sum(j.node_bytes for j in done)
    tail = checkpoints_kept(sum(j.checkpoint_bytes for j in report.jobs
                                if not j.remove_checkpoints), checkpoints)
    what = counted(len(done), "Slurm job")
    err.print(f"removed the files of {what}: {size(freed)} on the nodes{tail}" if removing
              else f"would remove the files of {what}: {size(freed)} on the nodes{tail}; "
                   f"--yes removes them")


def _line(job: SlurmJobPrune, now: float, removing: bool) -> str:
    parts = files_on_nodes(job, "job dir", "no job dir")
    return (f"Slurm job {job.job_id}, ended, last written {ago(now - job.last_written)} "
            f"ago: {escape('; '.join(parts))}{outcome(job.problem, removing)}")


def payload(report: SlurmPruneReport | None) -> dict[str, Any] | None:
    if report is None:
        return None
    return {
        "jobs": [{"job": j.job_id, "last_written": j.last_written, "removed": j.removed,
                  "problem": j.problem or None,
                  "checkpoints_removed": j.remove_checkpoints and j.removed,
                  "nodes": {n: {"job_bytes": f.job_bytes, "checkpoint_bytes":
                                f.checkpoint_bytes} for n, f in sorted(j.nodes.items())}}
                 for j in report.jobs],
        "skipped": [{"job": job_id, "why": why} for job_id, why in report.skipped],
    }
