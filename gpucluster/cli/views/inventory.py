"""`inventory show` and `inventory check`: the resolved hosts, the problems found."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from gpucluster.env_names import masked
from gpucluster.errors import Problem
from gpucluster.inventory import Inventory
from gpucluster.wording import counted


def hosts_payload(inventory: Inventory) -> dict[str, Any]:
    return {
        "inventory": str(inventory.path),
        "cluster": {
            "rendezvous_port": inventory.cluster.rendezvous_port,
            "python": inventory.cluster.python,
            "torchrun": inventory.cluster.torchrun,
            "env": masked(dict(inventory.cluster.env)),
            "image": inventory.cluster.image,
            "work_dir": inventory.cluster.work_dir,
            "known_hosts": inventory.cluster.known_hosts,
        },
        "groups": {name: list(members) for name, members in inventory.groups.items()},
        "hosts": [
            {
                "name": h.name, "address": h.address, "user": h.user, "port": h.port,
                "identity_file": h.identity_file, "jump_host": h.jump_host,
                "connection": h.connection, "gpus": h.gpus, "gpu_model": h.gpu_model,
                "torch_device": h.torch_device, "spare": h.spare,
                "labels": dict(h.labels), "groups": list(h.groups),
            }
            for h in inventory.hosts
        ],
    }


def print_hosts(console: Console, inventory: Inventory) -> None:
    """The resolved hosts; columns that are empty for every host are left out, and what
    every host shares is said once above the table (a GPU model in every row wrapped
    each host over four lines at 80 columns)."""
    columns: dict[str, list[str]] = {
        "name": [h.name for h in inventory.hosts],
        "address": ["local" if h.is_local else h.address for h in inventory.hosts],
        "user": [h.user for h in inventory.hosts],
        "port": [str(h.port) for h in inventory.hosts],
        "via": [h.jump_host or "" for h in inventory.hosts],
        "gpus": ["" if h.gpus is None else str(h.gpus) for h in inventory.hosts],
        "model": [h.gpu_model or "" for h in inventory.hosts],
        "torch": ["cpu" if h.torch_device == "cpu" else "" for h in inventory.hosts],
        "spare": ["spare" if h.spare else "" for h in inventory.hosts],
        "groups": [", ".join(h.groups) for h in inventory.hosts],  # a space: wraps there
        "labels": [", ".join(f"{k}={v}" for k, v in h.labels.items())
                   for h in inventory.hosts],
    }
    shown = {name: cells for name, cells in columns.items() if any(cells)}
    shared = {name: cells[0] for name, cells in shown.items()
              if len(cells) > 1 and name not in ("name", "address") and len(set(cells)) == 1}
    table = Table(title=f"{counted(len(inventory.hosts), 'host')} in {inventory.path}")
    for name in shown:
        if name not in shared:
            # a long cell (labels without a space) folds onto a second line, never cut
            table.add_column(name, no_wrap=name in ("name", "address"), overflow="fold")
    for row in zip(*(cells for name, cells in shown.items() if name not in shared),
                   strict=True):
        table.add_row(*row)
    console.print(table)
    if shared:
        console.print("every host: " + ", ".join(f"{name} {value}"
                                                 for name, value in shared.items()))
    cluster = inventory.cluster
    console.print(f"head (rendezvous): {inventory.head.name}:{cluster.rendezvous_port}  "
                  f"python: {cluster.python}  work_dir: {cluster.work_dir}")


def check_payload(inventory: Inventory | None, problems: list[Problem]) -> dict[str, Any]:
    """`inventory check --json`: ok, the counts, or every problem with file, line, fix."""
    return {
        "ok": not problems,
        "inventory": str(inventory.path) if inventory else (problems[0].path if problems
                                                               else None),
        "hosts": len(inventory.hosts) if inventory else None,
        "groups": len(inventory.groups) if inventory else None,
        "problems": [{"file": p.path, "line": p.line, "message": p.message, "fix": p.fix}
                     for p in problems],
    }
