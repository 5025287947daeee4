"""Every remote command provision runs is logged in the state directory: host, command,
exit code, duration. Environment values and stdin are never written, only their names
and sizes, so secrets cannot leak into the log."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Collection, Mapping
from pathlib import Path

from gpucluster.remote.connection import Connection, LineCallback, Stdin
from gpucluster.remote.result import CommandResult, RemoteError


class CommandLog:
    """An append-only log file shared by every connection of one run."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def write(self, host: str, text: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        with self._lock, self.path.open("a") as handle:
            handle.write(f"{stamp} {host}: {text}\n")


class LoggedConnection:
    """A connection whose every command is written to the command log."""

    def __init__(self, connection: Connection, log: CommandLog,
                 primed: Mapping[tuple[str, bool], CommandResult] | None = None) -> None:
        self.host = connection.host
        self._connection = connection
        self._log = log
        self._primed = dict(primed or {})  # reads done ahead (provision/prefetch.py)
        # The reads ahead that this connection's writes may change; None: every one. A
        # step whose writes no other step reads narrows it to its own reads.
        self.writes_change: Collection[tuple[str, bool]] | None = None

    def run(self, command: str, timeout: float, sudo: bool = False,
            env: Mapping[str, str] | None = None, stdin: Stdin = None,
            on_line: LineCallback | None = None) -> CommandResult:
        extras = []
        if sudo:
            extras.append("sudo")
        if env:
            extras.append("env " + ",".join(sorted(env)))  # names only, never values
        if stdin is not None:
            size = len(stdin) if isinstance(stdin, bytes) else "streamed"
            extras.append(f"stdin {size} bytes" if size != "streamed" else "stdin streamed")
        prefix = f"[{'; '.join(extras)}] " if extras else ""
        lines = command.splitlines()
        shown = command if len(lines) <= 1 else f"{lines[0]} ... ({len(lines)} lines)"
        if not extras or extras == ["sudo"]:
            primed = self._primed.pop((command, sudo), None)
            if primed is not None:
                how = "read back with the write" if primed.command != command else "read ahead"
                self._log.write(self.host, f"{prefix}{shown!r} -> exit {primed.exit_code}, "
                                           f"{how}")
                return dataclasses.replace(primed, command=command)
        self._forget_what_may_change()  # this command may change what was read ahead
        try:
            result = self._connection.run(command, timeout, sudo=sudo, env=env, stdin=stdin,
                                          on_line=on_line)
        except RemoteError as error:
            self._log.write(self.host, f"{prefix}{shown!r} -> {error.kind.value}: "
                                       f"{error.message}")
            raise
        self._log.write(self.host, f"{prefix}{shown!r} -> exit {result.exit_code} in "
                                   f"{result.duration_s:.2f}s")
        return result

    def run_then_read(self, command: str, read: str, timeout: float, sudo: bool = False,
                      stdin: Stdin = None) -> CommandResult:
        """`command` (a write, which prints nothing on stdout), then the read-only `read`
        in the same round trip: when the write succeeded, the next time `read` is asked
        for, its answer is this result's stdout, read after the write."""
        result = self.run(f"{command}\nset +e\n{read}", timeout, sudo=sudo, stdin=stdin)
        if result.ok:
            self._primed[(read, sudo)] = result
        return result

    def _forget_what_may_change(self) -> None:
        if self.writes_change is None:
            self._primed.clear()
            return
        for read in self.writes_change:
            self._primed.pop(read, None)
