"""`gpucluster inventory show|check|example`."""

from __future__ import annotations

import sys

import typer

from gpucluster.cli.options import InventoryOption, JsonOption, load_inventory, stdout_console
from gpucluster.cli.views import common
from gpucluster.cli.views import inventory as inventory_view
from gpucluster.errors import InventoryError

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
        stdout_console().print(f"{loaded.path}: OK, {len(loaded.hosts)} hosts, "
                               f"{len(loaded.groups)} groups")
