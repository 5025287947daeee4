"""`gpucluster inventory show|check|example`."""

from __future__ import annotations

import sys

import typer

from gpucluster import render
from gpucluster.cli.options import InventoryOption, JsonOption, load_inventory, stdout_console

app = typer.Typer(help="Inspect and validate the inventory.", no_args_is_help=True)


@app.command("show")
def show(inventory: InventoryOption = None, json_output: JsonOption = False) -> None:
    """Show every host as resolved (ranges expanded, ~/.ssh/config and defaults applied)."""
    loaded = load_inventory(inventory)
    console = stdout_console()
    if json_output:
        render.print_json(console, render.hosts_payload(loaded))
    else:
        render.print_hosts(console, loaded)


@app.command("example")
def example() -> None:
    """Print a commented example inventory with every key (a start for your own)."""
    from gpucluster.packaged import EXAMPLE_INVENTORY, packaged_path

    sys.stdout.write(packaged_path(EXAMPLE_INVENTORY).read_text())


@app.command("check")
def check(inventory: InventoryOption = None) -> None:
    """Validate the inventory; print every problem with file:line and a fix."""
    loaded = load_inventory(inventory)
    stdout_console().print(f"{loaded.path}: OK, {len(loaded.hosts)} hosts, "
                           f"{len(loaded.groups)} groups")
