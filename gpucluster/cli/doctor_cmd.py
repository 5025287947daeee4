"""`gpucluster doctor`: what is wrong, on which node, and how to fix it."""

from __future__ import annotations

from typing import Annotated

import typer

from gpucluster.cli.options import (
    AcceptNewOption,
    AskPassOption,
    AskSudoPassOption,
    ConnectTimeoutOption,
    GpusOption,
    GroupOption,
    HostsOption,
    InventoryOption,
    JsonOption,
    finite,
    load_inventory,
    open_session,
    stderr_console,
    stdout_console,
)
from gpucluster.cli.views import common
from gpucluster.errors import EXIT_FAILED, EXIT_OK
from gpucluster.selection import comma_list


def doctor(
    inventory: InventoryOption = None,
    hosts: HostsOption = None,
    group: GroupOption = None,
    only: Annotated[str | None, typer.Option(
        "--only", metavar="A,B", help="Only these checks (see --list).")] = None,
    skip: Annotated[str | None, typer.Option(
        "--skip", metavar="A,B", help="All checks but these.")] = None,
    list_checks: Annotated[bool, typer.Option("--list", help="List the checks and exit.")
                           ] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Treat warnings as failures.")
                      ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v",
                                          help="Show OK results and details too.")] = False,
    timeout: Annotated[float, typer.Option(
        "--timeout", min=1, metavar="SECONDS", callback=finite,
        help="Per-node limit for the probe.")] = 60.0,
    gpus: GpusOption = None,
    json_output: JsonOption = False,
    accept_new_host_keys: AcceptNewOption = False,
    ask_pass: AskPassOption = False,
    ask_sudo_pass: AskSudoPassOption = False,
    connect_timeout: ConnectTimeoutOption = None,
) -> None:
    """Check every node in parallel; exit 0 when nothing failed, 1 when a check failed."""
    from gpucluster.cli.views.doctor import payload, print_check_list, print_report
    from gpucluster.doctor.runner import run_doctor, select_checks

    if list_checks:
        print_check_list(stdout_console())
        return
    selected = select_checks(comma_list(only, "--only"), comma_list(skip, "--skip"))
    loaded = load_inventory(inventory, hosts, group)
    chosen = None
    if gpus is not None:  # as launch --gpus judges them, its rendezvous port too
        from gpucluster.doctor.gpu_selection import from_option
        from gpucluster.launch.request import job_inventory

        chosen = from_option(gpus)
        loaded = job_inventory(loaded, chosen)
    with open_session(loaded, accept_new_host_keys, ask_pass, connect_timeout,
                      ask_sudo_pass) as session, \
            common.host_progress(stderr_console(), len(loaded.hosts), "nodes probed") as advance:
        report = run_doctor(session, loaded, selected, probe_timeout=timeout,
                            on_node=lambda _host: advance(), gpus=chosen)
    from gpucluster.doctor.model import Status

    code = EXIT_FAILED if report.worst(strict) is Status.FAIL else EXIT_OK
    if json_output:
        common.print_json(stdout_console(), payload(report, code))
    else:
        print_report(stdout_console(), report, verbose)
    raise typer.Exit(code)
