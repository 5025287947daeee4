"""The controller's state directory: `.gpucluster/` beside the inventory."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpucluster.errors import GpuclusterError
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


@contextmanager
def exclusive(state_dir: Path, what: str) -> Iterator[None]:
    """Hold `<state_dir>/<what>.lock` while the body runs: two launches (or provisions)
    from beside the same inventory would otherwise race on the same code dir, ports
    and files. The lock goes with the process, however it ends."""
    path = state_dir / f"{what}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise GpuclusterError(f"another gpucluster {what} from beside this inventory is "
                                  f"under way (it holds {path}): wait for it to finish, then "
                                  f"rerun") from None
        yield
    finally:
        os.close(fd)
