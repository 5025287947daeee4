"""`gpucluster inventory show|check|example|export`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from gpucluster.cli.options import (
    InventoryOption,
    JsonOption,
    load_inventory,
    stdout_console,
    write_output,
)
from gpucluster.cli.views import common
from gpucluster.cli.views import inventory as inventory_view
from gpucluster.errors import InventoryError
from gpucluster.wording import counted

app = typer.Typer(help="Inspect and validate the inventory.", no_args_is_help=True)


@app.command("show")
def show(inventory: InventoryOption = None, json_output: JsonOption = False) -> None:
    """Show every host as resolved (ranges expanded, ~/.ssh/config and defaults applied)."""
    loaded = load_inventory(inventory)
    console = stdout_console()
    if json_output:
        common.print_json(console, inventory_view.hosts_payload(loaded))
    else:
        inventory_view.print_hosts(console, loaded)


@app.command("example")
def example() -> None:
    """Print a commented example inventory with every key (a start for your own)."""
    from gpucluster.packaged import EXAMPLE_INVENTORY, packaged_path

    sys.stdout.write(packaged_path(EXAMPLE_INVENTORY).read_text())


@app.command("check")
def check(inventory: InventoryOption = None, json_output: JsonOption = False) -> None:
    """Validate the inventory; print every problem with file:line and a fix."""
    try:
        loaded = load_inventory(inventory)
    except InventoryError as error:
        if not json_output:
            raise  # one line per problem, from the CLI's one error handler
        common.print_json(stdout_console(), inventory_view.check_payload(None, error.problems))
        raise typer.Exit(error.exit_code) from None
    if json_output:
        common.print_json(stdout_console(), inventory_view.check_payload(loaded, []))
    else:
        stdout_console().print(f"{loaded.path}: OK, {counted(len(loaded.hosts), 'host')}, "
                               f"{counted(len(loaded.groups), 'group')}")


@app.command("export")
def export(
    output_format: Annotated[str, typer.Option(
        "--format", "-F", metavar="FORMAT",
        help="ansible, ssh-config, hostfile (DeepSpeed), mpi (OpenMPI), mpich, clush "
             "(ClusterShell groups) or pdsh (a genders file); the tools' names (openssh, "
             "deepspeed, openmpi, clustershell, genders) work too.")],
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", metavar="FILE", help="Write here (default: stdout).")] = None,
    inventory: InventoryOption = None,
) -> None:
    """The cluster in the format another tool reads: Ansible, OpenSSH, DeepSpeed, MPI,
    ClusterShell, pdsh."""
    from gpucluster.errors import GpuclusterError
    from gpucluster.inventory.export import FORMAT_ALIASES, FORMATS

    output_format = FORMAT_ALIASES.get(output_format.lower(), output_format)
    if output_format not in FORMATS:
        raise GpuclusterError(f"--format {output_format!r}: not a format gpucluster writes "
                              f"(fix: one of {', '.join(FORMATS)})")
    write_output(output, FORMATS[output_format](load_inventory(inventory)))
