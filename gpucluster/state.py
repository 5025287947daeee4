"""The controller's state directory: `.gpucluster/` beside the inventory."""

from __future__ import annotations

from pathlib import Path

from gpucluster.inventory import Inventory


def state_dir_for(inventory: Inventory) -> Path:
    """`.gpucluster/` beside the inventory: the cluster key, command logs and jobs (0700)."""
    state_dir = inventory.path.resolve().parent / ".gpucluster"
    state_dir.mkdir(mode=0o700, exist_ok=True)
    state_dir.chmod(0o700)
    return state_dir
