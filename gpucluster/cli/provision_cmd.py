"""`gpucluster provision`: make the cluster right, idempotently."""

from __future__ import annotations

from typing import Annotated

import typer

from gpucluster.cli.options import (
    AcceptNewOption,
    AskPassOption,
    AskSudoPassOption,
    ConnectTimeoutOption,
    InventoryOption,
    JsonOption,
    load_inventory,
    open_session,
    stderr_console,
    stdout_console,
)
from gpucluster.cli.views import common
from gpucluster.errors import EXIT_FAILED
from gpucluster.selection import comma_list


def provision(
    inventory: InventoryOption = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Show per node exactly what would change (diffs, rule commands).")
    ] = False,
    only: Annotated[str | None, typer.Option(
        "--only", metavar="STEPS",
        help="Only these steps: parity,ssh-mesh,hosts,firewall,image,slurm,smoke.")
    ] = None,
    with_: Annotated[str | None, typer.Option(
        "--with", metavar="STEPS",
        help="Add optional steps: slurm (or enable it in the inventory's slurm: section).")
    ] = None,
    skip: Annotated[str | None, typer.Option("--skip", metavar="STEPS",
                                             help="All steps but these.")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Go on even when the parity gate finds the nodes differ.")] = False,
    verify: Annotated[bool, typer.Option(
        "--verify", help="Test every node-to-node SSH pair even when nothing changed (a "
                         "run that changes the mesh always does).")] = False,
    undo: Annotated[str | None, typer.Option(
        "--undo", metavar="STEP",
        help="Remove what a step added, exactly: ssh-mesh, hosts, firewall or slurm.")
    ] = None,
    json_output: JsonOption = False,
    accept_new_host_keys: AcceptNewOption = False,
    ask_pass: AskPassOption = False,
    ask_sudo_pass: AskSudoPassOption = False,
    connect_timeout: ConnectTimeoutOption = None,
) -> None:
    """Make every node right: SSH mesh, /etc/hosts, firewall, image (and Slurm, --with
    slurm); a re-run changes nothing."""
    from gpucluster.cli.views.provision import (
        phase_line,
        print_report,
        print_undo,
        summary_payload,
    )
    from gpucluster.provision import runner

    loaded = load_inventory(inventory)
    named = (comma_list(only, "--only"), comma_list(skip, "--skip"),
             comma_list(with_, "--with"))
    console = stdout_console()
    with open_session(loaded, accept_new_host_keys, ask_pass, connect_timeout,
                      ask_sudo_pass) as session:
        if undo is not None:
            results = runner.undo(session, loaded, undo)
            print_undo(console, results)
            if any(r.outcome.value == "failed" for r in results):
                raise typer.Exit(EXIT_FAILED)
            return
        steps = runner.select_steps(*named, loaded)
        say = common.phase_printer(stderr_console())
        with common.byte_progress(stderr_console()) as on_bytes:
            report = runner.provision(session, loaded, steps, dry_run, force,
                                      on_step=lambda step: say(phase_line(step)),
                                      on_image_progress=on_bytes, verify=verify)
    if json_output:
        common.print_json(console, summary_payload(report))
    else:
        print_report(console, report, dry_run)
    if report.failed:
        raise typer.Exit(EXIT_FAILED)
