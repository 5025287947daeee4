"""Reading and atomically replacing files on a node, and managed blocks inside them."""

from __future__ import annotations

import base64
import difflib
import hashlib
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpucluster import reports
from gpucluster.provision.logged import LoggedConnection
from gpucluster.remote.connection import shell_path
from gpucluster.remote.result import FailureKind, RemoteError
from gpucluster.templating import render


def markers(name: str = "gpucluster") -> tuple[str, str]:
    """The first and last line of cluster `name`'s managed block: a node in two
    inventories (two cluster names) keeps a block for each."""
    return (f"# BEGIN {name} managed block: `gpucluster provision` rewrites it, do not edit",
            f"# END {name} managed block")


BEGIN, END = markers()  # the default cluster name's


# Files are handled as text decoded with surrogateescape: bytes that are not UTF-8 go
# back out exactly as they came, and lines are split on "\n" alone (a CRLF line keeps
# its "\r"), so everything outside a managed block is rewritten byte for byte.
_CODEC = ("utf-8", "surrogateescape")


@dataclass(frozen=True)
class FileState:
    text: str | None  # None: no such file
    mode: str | None = None  # permission bits in octal, e.g. "600"


def lines_of(text: str | None) -> list[str]:
    """The file's lines, split on "\n" only, without the final newline."""
    if not text:
        return []
    return text.removesuffix("\n").split("\n")


def read_states(connection: LoggedConnection, paths: list[str], sudo: bool = False
                ) -> dict[str, FileState]:
    """Each file's text and permission bits (of the target, for a symlink), all in one
    round trip."""
    result = connection.run(read_script(paths), timeout=30, sudo=sudo)
    return parse_states(reports.sections(result.stdout), paths, result.stderr)


def read_script(paths: list[str]) -> str:
    """Shell that reports each of `paths` in a numbered section (parse_states reads it),
    for a caller that sends it along with its own round trip."""
    return render("provision/read_file.sh.j2", paths=[shell_path(p) for p in paths])


def parse_states(found: Mapping[str, reports.Section], paths: list[str], stderr: str = ""
                 ) -> dict[str, FileState]:
    states = {}
    for index, path in enumerate(paths):
        section = found.get(str(index))
        if section is None or section.exit_code != 0:
            raise RemoteError(FailureKind.ERROR, f"cannot read {path}: "
                                                 f"{stderr.strip() or 'no answer'}")
        first, _, body = section.output.partition("\n")
        if first == "absent":
            states[path] = FileState(None)
            continue
        try:
            text = base64.b64decode(body).decode(*_CODEC)
        except ValueError:
            raise RemoteError(FailureKind.ERROR, f"cannot read {path}: garbled transfer") \
                from None
        states[path] = FileState(text, first.removeprefix("mode ").strip() or None)
    return states


def read_state(connection: LoggedConnection, path: str, sudo: bool = False) -> FileState:
    return read_states(connection, [path], sudo)[path]


def read(connection: LoggedConnection, path: str, sudo: bool = False) -> str | None:
    """The file's text, or None when it does not exist."""
    return read_state(connection, path, sudo).text


@dataclass(frozen=True)
class NewFile:
    """A file to write: its whole new text, the mode a new file gets (a `private` one's
    always, and an `owner`'s, its owner), and the state provision planned on (`was`):
    the write is refused if the file no longer is what was read. None: not checked."""

    path: str
    text: str
    mode: str
    private: bool = False
    was: FileState | None = None
    owner: str | None = None  # user:group, where a new file must not be root's (as root)


def write_all(connection: LoggedConnection, new_files: Sequence[NewFile],
              sudo: bool = False, before: str = "",
              read_back: Sequence[str] | None = None) -> None:
    """Replace every file in one round trip (after the shell command `before`): each is
    written to a temp file beside it and checked (size and sha256), and only when all
    arrived whole, none changed since it was read and none is immutable is any renamed
    over its target. A reader, a cut connection or a Ctrl-C never sees half a file, nor
    some files new and others old. A symlink's target is written, the link kept. An
    existing file keeps its owner and mode, unless private: then it is always its mode.

    The files (or the paths `read_back`) are read back in the same round trip, and the
    connection keeps what was read as the answer to that read (`read_script` of those
    paths, as the same user): a step's re-check costs no round trip of its own."""
    script, data = write_script(new_files, before)
    paths = [f.path for f in new_files]
    again = read_script(list(read_back if read_back is not None else paths))
    result = connection.run_then_read(script, again, timeout=30, sudo=sudo, stdin=data)
    if not result.ok:
        raise RemoteError(FailureKind.ERROR, f"cannot write {', '.join(paths)}: "
                                             f"{result.stderr.strip()}")


def write_script(new_files: Sequence[NewFile], before: str = "") -> tuple[str, bytes]:
    """The shell that writes `new_files`, and what it reads on stdin."""
    data = [f.text.encode(*_CODEC) for f in new_files]
    script = render("provision/write_files.sh.j2", before=before, files=[
        {"n": n, "path": shell_path(f.path), "mode": f.mode, "private": f.private,
         "owner": f.owner and shlex.quote(f.owner), "size": len(body),
         "sha256": hashlib.sha256(body).hexdigest(),
         "was": None if f.was is None else _digest(f.was)}
        for n, (f, body) in enumerate(zip(new_files, data, strict=True), start=1)])
    return script, b"".join(data)


def _digest(state: FileState) -> str:
    """What the write script compares a file's sha256 with: "absent" for no file."""
    if state.text is None:
        return "absent"
    return hashlib.sha256(state.text.encode(*_CODEC)).hexdigest()


def write_atomically(connection: LoggedConnection, path: str, text: str, mode: str,
                     sudo: bool = False, private: bool = False) -> None:
    """One file, as write_all writes them."""
    write_all(connection, [NewFile(path, text, mode, private)], sudo)


def with_block(current: str | None, block_lines: list[str], at_top: bool = False,
               name: str = "gpucluster") -> str:
    """`current` with cluster `name`'s managed block replaced (or added); other lines
    (other clusters' blocks included) untouched."""
    begin, finish = markers(name)
    lines = lines_of(current)
    block = [begin, *block_lines, finish]
    if begin in lines and finish in lines[lines.index(begin):]:
        start = lines.index(begin)
        end = lines.index(finish, start)
        lines[start:end + 1] = block
    elif at_top:
        lines = block + lines
    else:
        lines = lines + block
    return "\n".join(lines) + "\n"


def without_block(current: str, name: str = "gpucluster") -> str:
    """`current` without cluster `name`'s managed block; as it is when it has none."""
    begin, finish = markers(name)
    lines = lines_of(current)
    if not (begin in lines and finish in lines[lines.index(begin):]):
        return current
    start = lines.index(begin)
    del lines[start:lines.index(finish, start) + 1]
    return "\n".join(lines) + ("\n" if lines else "")


def diff(path: str, current: str | None, desired: str) -> str:
    """A unified diff to show (bytes that are not UTF-8 shown as \ufffd)."""
    def shown(text: str | None) -> list[str]:
        printable = (text or "").encode(*_CODEC).decode("utf-8", "replace")
        return printable.splitlines(keepends=True)
    return "".join(difflib.unified_diff(shown(current), shown(desired),
                                        fromfile=f"{path} (now)",
                                        tofile=f"{path} (after provision)"))
