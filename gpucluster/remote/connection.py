"""The one interface every host connection offers, and how a command line is built.

Core code receives a `Connection`; it never knows whether the host is reached over SSH
or is the local machine, which keeps it testable against both.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import BinaryIO, Protocol

from gpucluster.env_names import is_env_name
from gpucluster.remote.result import CommandResult

LineCallback = Callable[[str, str], None]
"""Called as `on_line(stream, line)` with stream "stdout" or "stderr", newline stripped."""

Stdin = bytes | BinaryIO | None
"""Bytes for small input; an open binary file is streamed in chunks, never read whole."""

STDIN_CHUNK = 256 * 1024


class Connection(Protocol):
    """A host that can run shell commands."""

    host: str

    def connect(self) -> None:
        """Open the connection now (a no-op where there is none to open)."""
        ...

    def run(
        self,
        command: str,
        timeout: float,
        sudo: bool = False,
        env: Mapping[str, str] | None = None,
        stdin: Stdin = None,
        on_line: LineCallback | None = None,
    ) -> CommandResult:
        """Run `command` in a POSIX shell; output is both returned and, if `on_line` is
        given, streamed line by line while it runs. Raises RemoteError when the command
        could not run or did not finish within `timeout` seconds."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Envelope:
    """What the remote shell runs, and what goes first on its stdin."""

    command: str
    stdin_prefix: bytes = b""


def build_command(command: str, env: Mapping[str, str] | None, sudo: bool,
                  is_root: bool) -> Envelope:
    """Wrap `command` so that `env` arrives on stdin, never on a command line (where any
    user of the node sees it in ps and sudo logs it), then in non-interactive sudo.

    The values travel as `export NAME='value'` lines ahead of the caller's own stdin;
    the shell reads exactly that many lines with `read` (which never reads past a line
    on a pipe) and evals them, so the command's stdin starts where the caller's does."""
    prefix = b""
    if env:
        for name in env:
            if not is_env_name(name):
                raise ValueError(f"not a valid environment variable name: {name!r}")
        exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())
        prefix = exports.encode()
        command = (f'gpc_n={exports.count(chr(10))} gpc_e=; while [ "$gpc_n" -gt 0 ] && '
                   f'IFS= read -r gpc_l; do gpc_e="$gpc_e$gpc_l\n"; gpc_n=$((gpc_n - 1)); '
                   f'done; eval "$gpc_e"; unset gpc_n gpc_e gpc_l; {command}')
    if sudo and not is_root:
        # -n: fail at once instead of waiting for a password prompt nobody will answer.
        command = f"sudo -n -- /bin/sh -c {shlex.quote(command)}"
    return Envelope(command, prefix)


def shell_path(path: str) -> str:
    """Quote a path; a leading ~/ stays expandable by the remote shell."""
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


class LineSplitter:
    """Turns chunks of bytes from one stream into decoded lines for a callback."""

    def __init__(self, stream: str, on_line: LineCallback | None) -> None:
        self.stream = stream
        self.on_line = on_line
        self.chunks: list[bytes] = []
        self._partial = b""

    def feed(self, data: bytes) -> None:
        self.chunks.append(data)
        if self.on_line is None:
            return
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            self.on_line(self.stream, line.decode("utf-8", "replace").rstrip("\r"))

    def finish(self) -> str:
        if self.on_line is not None and self._partial:
            self.on_line(self.stream, self._partial.decode("utf-8", "replace").rstrip("\r"))
            self._partial = b""
        return b"".join(self.chunks).decode("utf-8", "replace")


def stdin_chunks(stdin: bytes | BinaryIO | None, prefix: bytes = b"") -> Iterator[bytes]:
    """Yield `prefix`, then stdin in chunks; a file is read STDIN_CHUNK bytes at a time,
    never whole."""
    if prefix:
        yield prefix
    if stdin is None:
        return
    if isinstance(stdin, bytes):
        yield stdin
        return
    while chunk := stdin.read(STDIN_CHUNK):
        yield chunk
