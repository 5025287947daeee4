"""The controller's state directory: `.gpucluster/` beside the inventory."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpucluster.errors import GpuclusterError
from gpucluster.inventory import Inventory


def state_dir_for(inventory: Inventory) -> Path:
    """`.gpucluster/` beside the inventory: the cluster key, command logs and jobs (0700)."""
    state_dir = inventory.path.resolve().parent / ".gpucluster"
    try:
        state_dir.mkdir(mode=0o700, exist_ok=True)
        state_dir.chmod(0o700)
        ignore = state_dir / ".gitignore"
        if not ignore.exists():  # it holds the cluster's private key: never commit it
            ignore.write_text("# written by gpucluster: this directory holds the "
                              "cluster's private key and job logs\n*\n")
    except OSError as error:
        raise GpuclusterError(
            f"{state_dir}: cannot keep gpucluster's state there: {error.strerror} (fix: "
            f"it lives beside the inventory: make {state_dir.parent} writable, or copy "
            f"{inventory.path.name} to a directory you can write)") from None
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


def new_log(directory: Path, prefix: str = "") -> Path:
    """A new, empty log file of one run's own, PREFIXYYYYmmdd-HHMMSS.log, made under
    `directory` (0700): a run started in the same second as another (a re-run right
    after a run) gets -2, -3... instead of writing into that run's file."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    stem = f"{prefix}{time.strftime('%Y%m%d-%H%M%S')}"
    path, attempt = directory / f"{stem}.log", 1
    while True:
        try:
            path.open("x").close()
        except FileExistsError:
            attempt += 1
            path = directory / f"{stem}-{attempt}.log"
        else:
            return path
