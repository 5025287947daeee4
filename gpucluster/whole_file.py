"""A file written whole: beside its path, then renamed over it, so that a reader (a tool,
sbatch, a user opening a bundle) never finds half of it, and a write that fails leaves
nothing behind."""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpucluster.errors import GpuclusterError


def check_writable(output: Path) -> None:
    """Refuse, in one line with the fix, a path that cannot be written: for commands to
    call before their work (a bundle's minutes of collection, a sync to every node)."""
    folder = output.absolute().parent
    if output.is_dir():
        raise GpuclusterError(f"{output}: is a directory (fix: name a file in it)")
    if not folder.is_dir():
        raise GpuclusterError(f"{output}: {folder} is not a directory (fix: mkdir -p "
                              f"{shlex.quote(str(folder))}, or another path)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise GpuclusterError(f"{output}: {folder} is not writable by you (fix: a path in "
                              f"a directory you can write)")


@contextmanager
def written_whole(output: Path, mode: int) -> Iterator[Path]:
    """The path to write, made with `mode` before anything is in it (a bundle's logs are
    the user's eyes only); renamed over `output` when the body ends. Any OSError, from
    the body too, removes it and is one line naming `output` and the reason."""
    check_writable(output)
    partial = output.with_name(output.name + ".partial")
    try:
        partial.unlink(missing_ok=True)
        partial.touch(mode=mode)
        partial.chmod(mode)  # touch's mode is cut by the umask
        yield partial
        partial.replace(output)
    except OSError as error:
        partial.unlink(missing_ok=True)
        raise GpuclusterError(f"{output}: cannot be written: {error.strerror or error} "
                              f"(nothing was left there)") from None
