"""`gpucluster smoke`: an all-reduce benchmark across every node and GPU."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from gpucluster import render
from gpucluster.cli.options import (
    AcceptNewOption,
    AskPassOption,
    ConnectTimeoutOption,
    InventoryOption,
    JsonOption,
    load_inventory,
    open_session,
    stdout_console,
)
from gpucluster.errors import EXIT_FAILED


def smoke(
    inventory: InventoryOption = None,
    nproc_per_node: Annotated[int | None, typer.Option(
        "--nproc-per-node", min=1,
        help="Processes per node (default: the inventory's GPU count; 1 on CPU nodes).")
    ] = None,
    sizes: Annotated[str, typer.Option(
        help="Message sizes in bytes, comma-separated; auto: 1 MiB-1 GiB on GPUs, "
             "64 KiB-4 MiB on CPUs.")] = "auto",
    iterations: Annotated[int, typer.Option(min=1, help="Timed iterations per size.")] = 5,
    min_busbw: Annotated[float | None, typer.Option(
        "--min-busbw", metavar="GBIT/S",
        help="Fail under this peak bus bandwidth (default: smoke.min_busbw_gbps).")] = None,
    timeout: Annotated[float, typer.Option(min=10, help="Seconds for the whole run.")] = 300,
    json_output: JsonOption = False,
    accept_new_host_keys: AcceptNewOption = False,
    ask_pass: AskPassOption = False,
    connect_timeout: ConnectTimeoutOption = None,
) -> None:
    """All-reduce across every node through torchrun: busbw per size, correctness, and
    the slow node named; exit 1 when it fails."""
    from gpucluster.smoke.runner import run_smoke

    loaded = load_inventory(inventory)
    with open_session(loaded, accept_new_host_keys, ask_pass, connect_timeout) as session:
        threshold = min_busbw if min_busbw is not None else loaded.smoke.min_busbw_gbps
        report = run_smoke(session, loaded, nproc_per_node, sizes, iterations, timeout,
                           threshold)
    console = stdout_console()
    if json_output:
        render.print_json(console, {**asdict(report), "passed": report.passed})
    else:
        table = Table(title=f"all-reduce, {report.world_size} ranks, backend "
                            f"{report.backend or '?'}")
        for column in ("size", "time", "algbw Gbit/s", "busbw Gbit/s", "correct"):
            table.add_column(column, justify="right")
        for entry in report.sweep:
            table.add_row(_size(entry["bytes"]), f"{entry['time_s'] * 1e3:.2f} ms",
                          f"{entry['algbw_gbps']:.3f}", f"{entry['busbw_gbps']:.3f}",
                          "yes" if entry["correct"] else "[bold red]NO[/]")
        console.print(table)
        for node, why in report.slow.items():
            console.print(f"[yellow]slow node {node}[/]: {escape(why)}")
        for problem in report.problems:
            console.print(f"[bold red]FAIL[/] {escape(problem)}")
        console.print("smoke: " + ("passed" if report.passed else "FAILED"))
    if not report.passed:
        raise typer.Exit(EXIT_FAILED)


def _size(count: int) -> str:
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= factor:
            return f"{count / factor:g} {unit}"
    return f"{count} B"
