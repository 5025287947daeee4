"""`gpucluster smoke`: the all-reduce sweep as a table, the slow nodes, the verdict."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpucluster.smoke.runner import SmokeReport
from gpucluster.wording import counted, size


def smoke_payload(report: SmokeReport) -> dict[str, Any]:
    return {**asdict(report), "passed": report.passed}


def print_smoke(console: Console, report: SmokeReport) -> None:
    if report.sweep:  # else nothing was measured: the problems say why
        console.print(_sweep_table(report))
    if report.sweep and report.world_size == 1:
        console.print("[yellow]one rank: the all-reduce crossed no link and no other GPU "
                      "(busbw is 0 by definition); it checks torch and the backend only[/]")
    for node, why in report.slow.items():
        console.print(f"[yellow]slow node {node}[/]: {escape(why)}")
    for problem in report.problems:
        console.print(f"[bold red]FAIL[/] {escape(problem)}")
    console.print("smoke: " + ("passed" if report.passed else "FAILED"))


def _sweep_table(report: SmokeReport) -> Table:
    table = Table(title=f"all-reduce, {counted(report.world_size, 'rank')}, backend "
                        f"{report.backend or '?'}"
                        + (f", on GPU {report.gpus}" if report.gpus else ""))
    for column in ("size", "time", "algbw Gbit/s", "busbw Gbit/s", "correct"):
        table.add_column(column, justify="right")
    for entry in report.sweep:
        table.add_row(size(entry["bytes"]), f"{entry['time_s'] * 1e3:.2f} ms",
                      f"{entry['algbw_gbps']:.3f}", f"{entry['busbw_gbps']:.3f}",
                      "yes" if entry["correct"] else "[bold red]NO[/]")
    return table


