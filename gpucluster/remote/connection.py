"""The one interface every host connection offers, and how a command line is built.

Core code receives a `Connection`; it never knows whether the host is reached over SSH
or is the local machine, which keeps it testable against both.
"""

from __future__ import annotations

import shlex
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import BinaryIO, Protocol

from gpucluster.env_names import is_env_name
from gpucluster.remote.result import CommandResult, FailureKind, RemoteError

LineCallback = Callable[[str, str], None]
"""Called as `on_line(stream, line)` with stream "stdout" or "stderr", newline stripped."""

Stdin = bytes | BinaryIO | None
"""Bytes for small input; an open binary file is streamed in chunks, never read whole."""

STDIN_CHUNK = 256 * 1024
CAPTURE_LIMIT_BYTES = 16 * 1024 * 1024  # per stream and command: the tail is kept
MAX_LINE_BYTES = 1024 * 1024  # a longer line is streamed in pieces


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

    def end_running(self) -> None:
        """End every command still running here (Ctrl-C, a step out of time), with all
        it started: TERM, then KILL. Bounded; silent where nothing runs."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Envelope:
    """What the remote shell runs, and what goes first on its stdin."""

    command: str
    stdin_prefix: bytes = b""


# `sh -c`'s script is one argument, at most 128 KiB on Linux (MAX_ARG_STRLEN): prune's
# script for 600 old jobs (400 KiB) failed with "Argument list too long". A script past
# this size goes on stdin instead.
INLINE_SCRIPT_LIMIT = 64 * 1024


def build_command(command: str, env: Mapping[str, str] | None, sudo: bool,
                  is_root: bool, sudo_password: str | None = None,
                  stdin_follows: bool = True) -> Envelope:
    """Wrap `command` so that `env` arrives on stdin, never on a command line (where any
    user of the node sees it in ps and sudo logs it), then in sudo: non-interactive, or
    with `sudo_password` (--ask-sudo-pass) as SUDO_WITH_PASSWORD takes it. A command
    over INLINE_SCRIPT_LIMIT arrives on stdin too (`stdin_follows`: the caller's own
    stdin comes after it).

    The values travel as `export NAME='value'` lines ahead of the caller's own stdin;
    the shell reads exactly that many lines with `read` (which never reads past a line
    on a pipe) and evals them, so the command's stdin starts where the caller's does."""
    prefix = b""
    if len(command.encode()) > INLINE_SCRIPT_LIMIT:
        prefix = command.encode()
        command = eval_stdin_bytes(len(prefix), exact=stdin_follows)
    if env:
        for name in env:
            if not is_env_name(name):
                raise ValueError(f"not a valid environment variable name: {name!r}")
        exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())
        prefix = exports.encode() + prefix
        command = f"{eval_stdin_lines(str(exports.count(chr(10))))}; {command}"
    if sudo and not is_root:
        if sudo_password is None:
            # -n: fail at once instead of waiting for a password prompt nobody will answer.
            command = f"sudo -n -- /bin/sh -c {shlex.quote(command)}"
        else:  # the password first, read by the user's shell; the env lines by root's
            command = (f"{READ_SUDO_PASSWORD} && {SUDO_WITH_PASSWORD} -- /bin/sh -c "
                       f"{shlex.quote(command)}")
            prefix = password_line(sudo_password) + prefix
    return Envelope(command, prefix)


def password_line(password: str) -> bytes:
    """The --ask-sudo-pass password as the first line of a command's stdin, where
    READ_SUDO_PASSWORD (or a node script's own read) takes it: never a command line."""
    return f"{password}\n".encode()


SUDO_PASSWORD_VARIABLE = "GPC_SUDO_PASSWORD"  # noqa: S105 - a variable's name
# Reads the password (--ask-sudo-pass) from the first line of stdin into that variable:
# never on a command line.
READ_SUDO_PASSWORD = f"IFS= read -r {SUDO_PASSWORD_VARIABLE} && export {SUDO_PASSWORD_VARIABLE}"
# sudo that answers its prompt from the variable: -A runs SUDO_ASKPASS with the prompt as
# its one argument, and the prompt is the variable's name, so printenv prints the
# password. Where sudo asks nothing (a NOPASSWD rule) the password goes nowhere, and
# sudo's env_reset keeps it out of the command's environment.
ASKPASS_SUDO = f"sudo -A -p {SUDO_PASSWORD_VARIABLE}"
SUDO_WITH_PASSWORD = f'SUDO_ASKPASS="$(command -v printenv)" {ASKPASS_SUDO}'
# Tries the password in the variable once (sudo -S reads one line; -A would ask up to
# three times, and three failures lock an account under pam_faillock): exit 0 when sudo
# accepts it, or asks none.
TRY_SUDO_PASSWORD = f"printf '%s\\n' \"${SUDO_PASSWORD_VARIABLE}\" | sudo -S -k -p '' true"
# The same, the password on stdin's first line.
CHECK_SUDO_PASSWORD = f"{READ_SUDO_PASSWORD} && {TRY_SUDO_PASSWORD}"


def typed_sudo_context(typed: bool) -> dict[str, object]:
    """What templates/_typed_sudo.sh.j2 needs: whether the script's stdin starts with the
    password, and the pieces above it reads it with."""
    return {"typed_sudo": typed, "variable": SUDO_PASSWORD_VARIABLE,
            "try_password": TRY_SUDO_PASSWORD, "askpass_sudo": ASKPASS_SUDO}


def eval_stdin_lines(count: str) -> str:
    """Shell that reads `count` lines (a number, or a shell word that expands to one) from
    stdin and evals them. `read` never reads past a line on a pipe, so whatever follows
    them on stdin stays there for what runs next."""
    return (f'gpc_n={count} gpc_e=; while [ "$gpc_n" -gt 0 ] && IFS= read -r gpc_l; do '
            f'gpc_e="$gpc_e$gpc_l\n"; gpc_n=$((gpc_n - 1)); done; eval "$gpc_e"; '
            f'unset gpc_n gpc_e gpc_l')


def eval_stdin_bytes(count: int, exact: bool) -> str:
    """Shell that reads a script of `count` bytes from stdin and evals it: whole, with
    `head -c` (per line, `read` took 18 s for 480 KiB under bash, its string growing
    line by line), or `exact`ly, where the caller's stdin follows it, with a `dd` that
    reads a byte at a time (0.4 s for that script): busybox's head reads past its count
    on a pipe."""
    reader = f"dd bs=1 count={count} 2>/dev/null" if exact else f"head -c {count}"
    return f'gpc_s=$({reader}) && eval "$gpc_s"'


def shell_path(path: str) -> str:
    """Quote a path; a leading ~/ (or ~ alone) stays expandable by the remote shell."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def timed_out(stdout: LineSplitter, stderr: LineSplitter) -> RemoteError:
    """A command out of time, with what it had printed: how far it got is the first
    thing its user asks."""
    return RemoteError(FailureKind.TIMED_OUT, "command did not finish in time",
                       output=stdout.finish() + stderr.finish())


class LineSplitter:
    """Turns chunks of bytes from one stream into decoded lines for a callback, and keeps
    the stream's last `keep_bytes` for the result: a host that floods its output (or a
    job followed for weeks) costs the controller a bounded amount of memory."""

    def __init__(self, stream: str, on_line: LineCallback | None,
                 keep_bytes: int = CAPTURE_LIMIT_BYTES) -> None:
        self.stream = stream
        self.on_line = on_line
        self.keep_bytes = keep_bytes
        self.chunks: deque[bytes] = deque()
        self.kept = 0
        self.cut = 0  # bytes dropped from the front
        self._partial = bytearray()

    def feed(self, data: bytes) -> None:
        self._keep(data)
        if self.on_line is None:
            return
        start = 0
        # Only the new data is searched: a long line without a newline (a progress bar
        # redrawn with \r) costs linear time, not quadratic.
        while (end := data.find(b"\n", start)) != -1:
            self._partial += data[start:end]
            self._emit()
            start = end + 1
        self._partial += data[start:]
        if len(self._partial) > MAX_LINE_BYTES:
            self._emit()  # an endless line is passed on in pieces, never held whole

    def _emit(self) -> None:
        assert self.on_line is not None
        self.on_line(self.stream, self._partial.decode("utf-8", "replace").rstrip("\r"))
        self._partial.clear()

    def _keep(self, data: bytes) -> None:
        self.chunks.append(data)
        self.kept += len(data)
        while self.kept > self.keep_bytes and len(self.chunks) > 1:
            dropped = self.chunks.popleft()
            self.kept -= len(dropped)
            self.cut += len(dropped)
        if self.kept > self.keep_bytes:  # one chunk larger than the limit: keep its tail
            only = self.chunks.popleft()
            self.chunks.append(only[-self.keep_bytes:])
            self.cut += len(only) - self.keep_bytes
            self.kept = self.keep_bytes

    def finish(self) -> str:
        if self.on_line is not None and self._partial:
            self._emit()
        text = b"".join(self.chunks).decode("utf-8", "replace")
        if self.cut:
            return f"[gpucluster: the first {self.cut} bytes of {self.stream} were cut; " \
                   f"the last {self.kept} follow]\n" + text
        return text


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
    # read1: what a pipe has now (up to a chunk), not a full chunk's wait: a stream
    # (an image) goes on the wire as it is produced.
    read = getattr(stdin, "read1", stdin.read)
    while chunk := read(STDIN_CHUNK):
        yield chunk
