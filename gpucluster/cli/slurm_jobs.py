"""Slurm's jobs in gpucluster's day-two commands: `jobs` lists Slurm's queue under the
cluster's own jobs, `logs [-f] slurm-ID` shows (or follows) a Slurm job's output, `stop
slurm-ID` cancels it; `export sbatch --follow` follows the job it submitted."""

from __future__ import annotations

import io
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape

from gpucluster.cli.options import stderr_console, stdout_console
from gpucluster.errors import EXIT_FAILED, Interrupted

if TYPE_CHECKING:
    from gpucluster.cli.views.line_printer import LinePrinter
    from gpucluster.inventory import Inventory
    from gpucluster.launch.logsearch import LogFilter
    from gpucluster.remote.session import Session
    from gpucluster.slurm.follow import JobInfo
    from gpucluster.slurm.queue import QueuedJob


def output(session: Session, inventory: Inventory, job_id: str, live: bool,
           tail: int | None = None, keep: LogFilter | None = None) -> None:
    """The job's output to stdout (from its last `tail` lines when given), its lines as
    [node/rank] (output_lines): until it ends (`live`, then exit 1 unless it COMPLETED),
    else what it has written so far; its state on stderr. Ctrl-C stops following, never
    the job. With `keep`, the lines it keeps: of the whole file, the last `tail` of them
    when given; live, of the file from its last `tail` lines on."""
    from gpucluster.cli.views.line_printer import LinePrinter
    from gpucluster.slurm.follow import follow, unknown_job
    from gpucluster.slurm.output_lines import SlurmLines

    last = io.StringIO() if keep is not None and tail is not None and not live else None
    printer = LinePrinter(last if last is not None else sys.stdout,
                          full_logs=f"gpucluster logs slurm-{job_id}" if live else None,
                          live=live)
    kept = _Kept(printer, keep) if keep is not None else None
    lines = SlurmLines(kept.line if kept else printer, kept.as_written if kept else
                       printer.as_written, live)
    err = stderr_console()
    try:
        ended = follow(session, inventory, job_id, lines.feed,
                       lambda status: err.print(f"Slurm job {job_id}: {escape(status)}"),
                       live=live, tail=None if last is not None else tail)
    except KeyboardInterrupt:
        raise Interrupted(f"stopped following; Slurm job {job_id} goes on (gpucluster stop "
                          f"slurm-{job_id} ends it)") from None
    finally:
        lines.finish()
        if kept:
            kept.finish()
        printer.finish()
        if last is not None and tail is not None:
            kept_lines = last.getvalue().splitlines(keepends=True)
            sys.stdout.write("".join(kept_lines[max(len(kept_lines) - tail, 0):]))
            sys.stdout.flush()
    if kept and not kept.shown:
        err.print(f"no line of Slurm job {job_id} matches")
    if not ended.ended:  # not live: it goes on
        err.print(f"Slurm job {job_id}: {escape(ended.status)} (gpucluster logs -f "
                  f"slurm-{job_id} follows it)")
        return
    if not ended.batch_host:
        raise unknown_job(job_id, f"its output stays in slurm-{job_id}.out where it was "
                                  f"submitted")
    err.print(f"Slurm job {job_id} {ending(ended)}")
    failure = lines.first_failure() if ended.state != "COMPLETED" else None
    if failure is not None:
        from gpucluster.cli.views.launch import print_failure

        print_failure(err, failure)
    if live and ended.state != "COMPLETED":
        raise typer.Exit(EXIT_FAILED)


class _Kept:
    """The lines of a Slurm job that a search keeps: a node's by its node, rank and
    text; one without a label (no node's, no rank's) by --grep alone, once whole."""

    def __init__(self, printer: LinePrinter, keep: LogFilter) -> None:
        self._printer, self._keep = printer, keep
        self._unlabelled = keep.nodes is None and keep.ranks is None
        self._open = ""
        self.shown = 0

    def line(self, node: str, rank: str | None, text: str) -> None:
        if self._keep.keeps_as_it_comes(node, rank, text):
            self._printer(node, rank, text)
            self.shown += 1

    def as_written(self, text: str) -> None:
        *whole, self._open = (self._open + text).split("\n")
        for line in whole:
            self._written(line)

    def finish(self) -> None:
        if self._open:
            self._written(self._open)
            self._open = ""

    def _written(self, line: str) -> None:
        pattern = self._keep.pattern
        if self._unlabelled and pattern is not None and pattern.search(line):
            self._printer.as_written(line + "\n")
            self.shown += 1


def ending(info: JobInfo) -> str:
    """`completed`, `failed (exit 1:0)`, `cancelled (exit 0:15)`."""
    if info.state == "COMPLETED":
        return "completed"
    if not info.state:
        return "ended, but Slurm no longer knows how"
    return f"{info.state.lower()} (exit {info.exit_code})"


def cancel(session: Session, inventory: Inventory, job_id: str, json_output: bool) -> None:
    """scancel, then Slurm's word that the job has ended."""
    from gpucluster.cli.views import common
    from gpucluster.slurm.queue import cancel as scancel

    info, already = scancel(session, inventory, job_id)
    if json_output:
        common.print_json(stdout_console(), {
            "slurm_job": job_id, "state": info.state, "exit_code": info.exit_code,
            "clean": info.ended, "already_ended": already})
    elif already:
        print(f"Slurm job {job_id} had already ended: {ending(info)}")
    elif info.ended:
        print(f"Slurm job {job_id} cancelled: {ending(info)}")
    else:
        print(f"Slurm job {job_id} cancelled, still {info.status}: Slurm is ending it "
              f"(squeue -j {job_id} on a node)")
    if not info.ended:
        raise typer.Exit(EXIT_FAILED)


def print_queue(console: Console, jobs: Sequence[QueuedJob]) -> None:
    from gpucluster.cli.views.common import print_table

    if not jobs:
        console.print("Slurm's queue is empty")
        return
    # Those in the queue first, then those that ended (Slurm keeps them a few minutes).
    ordered = sorted(jobs, key=lambda j: j.ended)
    rows = [(f"slurm-{j.id}", escape(j.name), escape(j.user), j.state.lower(), j.elapsed,
             str(j.nodes), escape(j.where)) for j in ordered]
    print_table(console, "Slurm's jobs (gpucluster logs -f slurm-ID follows one)",
                ("job", "name", "user", "state", "time", "nodes", "where / why"),
                rows)
    for job in ordered:
        if job.ended and job.state not in ("COMPLETED", "CANCELLED"):  # one asked for
            console.print(f"slurm-{job.id} {job.state.lower()}{_why(job.where)}: gpucluster "
                          f"logs slurm-{job.id} shows its output")


def _why(where: str) -> str:
    """An ended job's reason as squeue writes it, `(NonZeroExitCode)`, or nothing."""
    return f" {escape(where)}" if where.startswith("(") and where != "(None)" else ""


def queue_payload(jobs: Sequence[QueuedJob] | None) -> list[dict[str, Any]] | None:
    return None if jobs is None else [
        {"id": j.id, "name": j.name, "user": j.user, "state": j.state, "elapsed": j.elapsed,
         "nodes": j.nodes, "where": j.where} for j in jobs]
