"""One command on an open SSH channel: its stdin fed, both streams read to the end
under a deadline, and the pid its login shell reports taken off stderr (so that what
the command started can be ended if it must be)."""

from __future__ import annotations

import contextlib
import select
import threading
import time
from typing import TYPE_CHECKING

from gpucluster import reports
from gpucluster.remote.connection import LineSplitter, Stdin, stdin_chunks, timed_out

if TYPE_CHECKING:
    import paramiko

PID_REPORT = f"{reports.MARK} pid"  # stderr's first line after login scripts': the shell's pid


def pump(channel: paramiko.Channel, stdout: LineSplitter, stderr: PidFilter,
          deadline: float) -> None:
    """Read both streams until the command has exited and its output is drained."""
    while True:
        drained = True
        while channel.recv_ready():
            stdout.feed(channel.recv(65536))
            drained = False
        while channel.recv_stderr_ready():
            stderr.feed(channel.recv_stderr(65536))
            drained = False
        if drained and channel.exit_status_ready() and (channel.eof_received or channel.closed):
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise timed_out(stdout, stderr.stderr)
        if not drained:
            continue
        if channel.eof_received:
            # Output is closed: wait for the exit status rather than spin on select.
            channel.status_event.wait(min(remaining, 1.0))
        else:
            select.select([channel], [], [], min(remaining, 1.0))


class RemoteGroup:
    """A running command's process group on the node (its login shell's pid)."""

    def __init__(self, as_root: bool) -> None:
        self.pid: int | None = None
        self.as_root = as_root
        self.reported = threading.Event()  # the pid line arrived (or never will)


class PidFilter:
    """Takes the pid report off stderr; passes the rest on unchanged. Lines before it are
    the login scripts' (a .bashrc's warnings): they pass on as they come, and the report
    after them is still found, so a timeout or Ctrl-C can still end the command."""

    def __init__(self, stderr: LineSplitter, group: RemoteGroup) -> None:
        self.stderr = stderr
        self.group = group
        self._head: bytes | None = b""  # None once the report line has been handled

    def feed(self, data: bytes) -> None:
        if self._head is None:
            self.stderr.feed(data)
            return
        self._head += data
        while self._head is not None:
            line, newline, rest = self._head.partition(b"\n")
            if not newline:
                return
            kind, pid = reports.parse(line.decode("ascii", "replace")) or ("", "")
            if kind == "pid" and pid.isdigit():
                self.group.pid = int(pid)
                self.group.reported.set()
                self._head = None
                if rest:
                    self.stderr.feed(rest)
            else:
                self.stderr.feed(line + newline)
                self._head = rest

    def finish(self) -> None:
        """The stream ended before the report (the shell never got to the command):
        what came is still the command's stderr."""
        if self._head:
            self.stderr.feed(self._head)
        self._head = None


def feed(channel: paramiko.Channel, stdin: Stdin, prefix: bytes) -> None:
    """Send stdin, then its end, even when reading it fails: a command left waiting
    for more input would hold its caller until the timeout (as a local pipe's close
    does in local.py)."""
    try:
        for chunk in stdin_chunks(stdin, prefix):
            channel.sendall(chunk)
    except (OSError, EOFError):
        pass  # the channel closed; the command's exit code tells the story
    finally:
        with contextlib.suppress(OSError, EOFError):
            channel.shutdown_write()
