"""`gpucluster smoke`: an all-reduce benchmark across every node and GPU."""

from __future__ import annotations

from typing import Annotated

import typer

from gpucluster.cli.options import (
    AcceptNewOption,
    AskPassOption,
    ConnectTimeoutOption,
    GpusOption,
    GroupOption,
    HostsOption,
    InventoryOption,
    JsonOption,
    finite,
    load_inventory,
    open_session,
    stdout_console,
)
from gpucluster.cli.views import common
from gpucluster.errors import EXIT_FAILED


def smoke(
    inventory: InventoryOption = None,
    hosts: HostsOption = None,
    group: GroupOption = None,
    nproc_per_node: Annotated[int | None, typer.Option(
        "--nproc-per-node", min=1,
        help="Processes per node (default: one per GPU, the inventory's gpus or else the "
             "GPUs found there; 1 on CPU nodes).")
    ] = None,
    gpus: GpusOption = None,
    sizes: Annotated[str, typer.Option(
        help="Message sizes, comma-separated: bytes, or with K, M, G (KiB, MiB, GiB), "
             "e.g. 1M,64M,1G; auto: 1 MiB-1 GiB on GPUs, 64 KiB-4 MiB on CPUs.")] = "auto",
    iterations: Annotated[int, typer.Option(min=1, help="Timed iterations per size.")] = 5,
    min_busbw: Annotated[float | None, typer.Option(
        "--min-busbw", min=0, metavar="GBIT/S", callback=finite,
        help="Fail under this peak bus bandwidth (default: smoke.min_busbw_gbps).")] = None,
    timeout: Annotated[float, typer.Option(min=10, callback=finite,
                                           help="Seconds for the whole run.")] = 300,
    json_output: JsonOption = False,
    accept_new_host_keys: AcceptNewOption = False,
    ask_pass: AskPassOption = False,
    connect_timeout: ConnectTimeoutOption = None,
) -> None:
    """All-reduce across every node through torchrun: busbw per size, correctness, and
    the slow node named; exit 1 when it fails. With --gpus, on those GPUs only, as a job
    launched with --gpus runs (its rendezvous port too): beside a job on others."""
    from gpucluster.cli.views.smoke import print_smoke, smoke_payload
    from gpucluster.doctor.gpu_selection import from_option
    from gpucluster.smoke.runner import parse_sizes, run_smoke

    sizes = parse_sizes(sizes)
    chosen = from_option(gpus) if gpus is not None else None
    loaded = load_inventory(inventory, hosts, group)
    with open_session(loaded, accept_new_host_keys, ask_pass, connect_timeout) as session:
        threshold = min_busbw if min_busbw is not None else loaded.smoke.min_busbw_gbps
        report = run_smoke(session, loaded, nproc_per_node, sizes, iterations, timeout,
                           threshold, chosen)
    console = stdout_console()
    if json_output:
        common.print_json(console, smoke_payload(report))
    else:
        print_smoke(console, report)
    if not report.passed:
        raise typer.Exit(EXIT_FAILED)
