"""Shells that log in ahead of time: one per host, opened now, each running the script
it is sent later, or nothing.

A login can cost more than the network: the node's login scripts (conda or pyenv init)
run for every command sent over SSH. A caller that must first ask every node something
(launch's readiness checks) opens the next round's sessions while the first one runs,
so the second round costs one message on an open channel instead of another login.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import BinaryIO, cast

from gpucluster.errors import Interrupted
from gpucluster.inventory import Host
from gpucluster.remote.connection import eval_stdin_lines
from gpucluster.remote.result import CommandResult, FanoutResult
from gpucluster.remote.session import Session

# Reads a line count, then that many lines of script, and runs them (with the reader
# the job's variables arrive by), leaving what follows on stdin for the script. The end
# of stdin before any count (the caller sent nothing) ends the shell quietly.
BOOTSTRAP = 'IFS= read -r gpc_c || exit 0; ' + eval_stdin_lines('"$gpc_c"')
CANCEL_WAIT_S = 30.0  # for the shells to see their stdin end, on the way out


def framed(script: str) -> bytes:
    """The script as BOOTSTRAP reads it: its line count, then its lines."""
    text = script if script.endswith("\n") else script + "\n"
    return f"{text.count(chr(10))}\n{text}".encode()


class DeferredStdin:
    """A command's stdin fed as the caller goes: what is sent now, then what is sent
    later, optionally a stream, then its end. The reader waits in between; `cancel`
    ends it wherever it is."""

    def __init__(self, ahead: bytes = b"") -> None:
        self._queue: queue.SimpleQueue[bytes | BinaryIO | None] = queue.SimpleQueue()
        self._pending = b""
        self._stream: BinaryIO | None = None
        self._ended = False
        if ahead:
            self.send(ahead)

    def send(self, data: bytes) -> None:
        self._queue.put(data)

    def give(self, head: bytes, rest: BinaryIO | None = None) -> None:
        """Send `head`, then `rest` to its end, then end."""
        self.send(head)
        if rest is not None:
            self._queue.put(rest)
        self._queue.put(None)

    def cancel(self) -> None:
        self._queue.put(None)

    def read1(self, size: int = -1) -> bytes:
        # No timeout of its own: the command's run has one, and every caller gives or
        # cancels its stdins on its way out, whatever happened.
        while not self._ended:
            if self._stream is not None:
                chunk = getattr(self._stream, "read1", self._stream.read)(size)
                if chunk:
                    return chunk
                self._stream = None
            elif self._pending:
                cut = len(self._pending) if size < 0 else size
                chunk, self._pending = self._pending[:cut], self._pending[cut:]
                return chunk
            else:
                item = self._queue.get()
                if item is None:
                    self._ended = True
                elif isinstance(item, bytes):
                    self._pending = item
                else:
                    self._stream = item
        return b""

    read = read1


class WaitingShells:
    """`with WaitingShells(...) as shells:` logs every host in at once; `shells.run()`
    sends each its script. Hosts not sent one, and all of them when the block ends
    without a run, get an empty stdin and end without doing anything."""

    def __init__(self, session: Session, hosts: Sequence[Host], timeout: float,
                 env: Mapping[str, str] | None = None) -> None:
        self._session = session
        self._hosts = list(hosts)
        self._timeout = timeout
        self._env = dict(env) if env else None
        self._stdins = {h.name: DeferredStdin() for h in self._hosts}
        self._result: FanoutResult[CommandResult] | None = None
        self._thread = threading.Thread(target=self._run_all, daemon=True)

    def __enter__(self) -> WaitingShells:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        for stdin in self._stdins.values():
            stdin.cancel()
        self._thread.join(CANCEL_WAIT_S)

    def _run_all(self) -> None:
        self._result = self._session.map(self._hosts, lambda c: c.run(
            BOOTSTRAP, timeout=self._timeout, env=self._env,
            stdin=cast("BinaryIO", self._stdins[c.host])))

    def run(self, payloads: Mapping[str, tuple[str, BinaryIO | None]]
            ) -> FanoutResult[CommandResult]:
        """Send each host its script (and a stream to follow it on stdin, if any), then
        wait for every host's to end; Ctrl-C closes every connection."""
        for name, stdin in self._stdins.items():
            if name in payloads:
                script, rest = payloads[name]
                stdin.give(framed(script), rest)
            else:
                stdin.cancel()
        try:
            while self._thread.is_alive():
                self._thread.join(0.2)
        except KeyboardInterrupt:
            self._session.close()
            raise Interrupted("interrupted; connections closed") from None
        assert self._result is not None
        return self._result
