"""The controller's state directory: `.gpucluster/` beside the inventory."""

from __future__ import annotations

from pathlib import Path

from gpucluster.inventory import Inventory


def state_dir_for(inventory: Inventory) -> Path:
    """`.gpucluster/` beside the inventory: the cluster key, command logs and jobs (0700)."""
    state_dir = inventory.path.resolve().parent / ".gpucluster"
    state_dir.mkdir(mode=0o700, exist_ok=True)
    state_dir.chmod(0o700)
    ignore = state_dir / ".gitignore"
    if not ignore.exists():  # it holds the cluster's private key: never commit it
        ignore.write_text("# written by gpucluster: this directory holds the cluster's "
                          "private key and job logs\n*\n")
    return state_dir
