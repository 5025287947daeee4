"""Reading and atomically replacing files on a node, and managed blocks inside them."""

from __future__ import annotations

import difflib

from gpucluster.provision.logged import LoggedConnection
from gpucluster.remote.connection import shell_path
from gpucluster.remote.result import FailureKind, RemoteError
from gpucluster.templating import render

BEGIN = "# BEGIN gpucluster managed block: `gpucluster provision` rewrites it, do not edit"
END = "# END gpucluster managed block"


def read(connection: LoggedConnection, path: str, sudo: bool = False) -> str | None:
    """The file's text, or None when it does not exist."""
    result = connection.run(render("provision/read_file.sh.j2", path=shell_path(path)),
                            timeout=30, sudo=sudo)
    if "__absent__" in result.stderr:
        return None
    if not result.ok:
        raise RemoteError(FailureKind.ERROR, f"cannot read {path}: {result.stderr.strip()}")
    return result.stdout


def write_atomically(connection: LoggedConnection, path: str, text: str, mode: str,
                     sudo: bool = False) -> None:
    """Write to a temp file beside `path`, then rename over it: a reader (or a Ctrl-C)
    never sees half a file. An existing file keeps its owner and mode."""
    script = render("provision/write_file.sh.j2", path=shell_path(path), mode=mode)
    result = connection.run(script, timeout=30, sudo=sudo, stdin=text.encode())
    if not result.ok:
        raise RemoteError(FailureKind.ERROR, f"cannot write {path}: {result.stderr.strip()}")


def with_block(current: str | None, block_lines: list[str], at_top: bool = False) -> str:
    """`current` with its managed block replaced (or added); other lines untouched."""
    lines = (current or "").splitlines()
    block = [BEGIN, *block_lines, END]
    if BEGIN in lines and END in lines[lines.index(BEGIN):]:
        start = lines.index(BEGIN)
        end = lines.index(END, start)
        lines[start:end + 1] = block
    elif at_top:
        lines = block + lines
    else:
        lines = lines + block
    return "\n".join(lines) + "\n"


def without_block(current: str) -> str:
    lines = current.splitlines()
    if BEGIN in lines and END in lines[lines.index(BEGIN):]:
        start = lines.index(BEGIN)
        del lines[start:lines.index(END, start) + 1]
    return "\n".join(lines) + ("\n" if lines else "")


def diff(path: str, current: str | None, desired: str) -> str:
    return "".join(difflib.unified_diff(
        (current or "").splitlines(keepends=True), desired.splitlines(keepends=True),
        fromfile=f"{path} (now)", tofile=f"{path} (after provision)"))
