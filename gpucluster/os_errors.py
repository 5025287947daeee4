"""An OSError about a user's file (a path too long, a disk full), wherever a user's path
reached it, as the one-line error the CLI prints; one about gpucluster's own files is a
bug's and keeps its traceback."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from gpucluster.errors import GpuclusterError
from gpucluster.packaged import PACKAGE

_OS_FIXES = {
    errno.ENAMETOOLONG: "a shorter path",
    errno.EACCES: "a path you may use, or run as its owner",
    errno.EPERM: "a path you may use, or run as its owner",
    errno.ENOSPC: "free space there, or another path",
    errno.EDQUOT: "free space there, or another path",
    errno.EROFS: "a path on a writable file system",
    errno.ENOENT: "check the path",
    errno.ENOTDIR: "check the path",
    errno.EISDIR: "name a file, not a directory",
}


def file_error(error: OSError) -> GpuclusterError | None:
    """An OSError about a named file as the one-line error it is for the user; None for
    one that names no file, or one of the package's own (a template, say): a bug's,
    which keeps its traceback. A disk full names no file: it came from writing one
    already open, the output redirected to a file (`gpucluster top --once > f`) most
    often."""
    if error.filename is None and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return GpuclusterError(f"a write failed: {error.strerror} (fix: free space where "
                               f"the output goes, or beside the inventory, in .gpucluster/)")
    if error.filename is None or _shipped(os.fsdecode(error.filename)):
        return None
    fix = _OS_FIXES.get(error.errno or 0)
    return GpuclusterError(f"{error.filename}: {error.strerror or error}"
                           + (f" (fix: {fix})" if fix else ""))


def _shipped(filename: str) -> bool:
    """A file gpucluster ships: the package, or templates/ beside it in a checkout."""
    path = Path(filename).resolve()
    return path.is_relative_to(PACKAGE) or path.is_relative_to(PACKAGE.parent / "templates")
