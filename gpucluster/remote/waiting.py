"""Shells that log in ahead of time: one per host, opened now, each running the script
it is sent later, or nothing.

A login can cost more than the network: the node's login scripts (conda or pyenv init)
run for every command sent over SSH. A caller that must first ask every node something
(launch's readiness checks) asks it in the same shell, as a step (`shells.step(host)` is
a Connection whose `run` sends one), and sends the script that follows once it has the
answers: two rounds for one login.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import BinaryIO, cast

from gpucluster import interrupts, reports
from gpucluster.errors import Interrupted
from gpucluster.inventory import Host
from gpucluster.remote.connection import (
    Connection,
    LineCallback,
    Stdin,
    eval_stdin_lines,
)
from gpucluster.remote.result import (
    CommandResult,
    FailureKind,
    FanoutResult,
    HostFailure,
    RemoteError,
)
from gpucluster.remote.session import Session

# Reads a line count, then that many lines of script, and runs them (with the reader
# the job's variables arrive by), leaving what follows on stdin for the script. The end
# of stdin before any count (the caller sent nothing) ends the shell quietly.
BOOTSTRAP = 'IFS= read -r gpc_c || exit 0; ' + eval_stdin_lines('"$gpc_c"')
CANCEL_WAIT_S = 30.0  # for the shells to see their stdin end, on the way out
STEP_END = "step-end"  # a step's exit code, said on each stream after its last line
_STEP_END_REPORT = f"{reports.MARK} {STEP_END} "  # ends a line: the step's may lack one


def framed(script: str) -> bytes:
    """The script as BOOTSTRAP reads it: its line count, then its lines."""
    text = script if script.endswith("\n") else script + "\n"
    return f"{text.count(chr(10))}\n{text}".encode()


def step_script(script: str) -> str:
    """A step: `script` in a subshell that reads nothing (what comes next on this shell's
    stdin is the next script), its exit code said on both streams (each arrives in order
    on its own, not with the other), then the wait for the next script."""
    said = f"printf '{_STEP_END_REPORT}%s\\n' \"$gpc_s\""
    return f"(\n{script}\n) </dev/null\ngpc_s=$?; {said} >&2; {said}\n{BOOTSTRAP}\n"


@dataclass
class _Step:
    """What one step printed, until its end was said on both streams."""

    on_line: LineCallback | None
    lines: dict[str, list[str]] = field(default_factory=lambda: {"stdout": [], "stderr": []})
    exit_codes: dict[str, str] = field(default_factory=dict)  # per stream, once said
    done: threading.Event = field(default_factory=threading.Event)  # or the shell ended

    def see(self, stream: str, line: str) -> None:
        if stream in self.exit_codes:
            return  # after this step, on this stream: the next script's
        output, end, exit_code = line.partition(_STEP_END_REPORT)
        if output or not end:  # a line of the step's, or its last one, without a newline
            self.lines[stream].append(output)
            if self.on_line is not None:
                self.on_line(stream, output)
        if end:
            self.exit_codes[stream] = exit_code.strip()
            if len(self.exit_codes) == 2:
                self.done.set()


def after_steps(text: str) -> str:
    """A stream's output less what its steps printed: what follows the last step's end."""
    lines = text.splitlines(keepends=True)
    ends = [i for i, line in enumerate(lines) if _STEP_END_REPORT in line]
    return "".join(lines[ends[-1] + 1:]) if ends else text


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
    without a run, get an empty stdin and end without doing anything. Before the run,
    `shells.step(host).run(...)` runs a step in the host's shell and returns its output."""

    def __init__(self, session: Session, hosts: Sequence[Host], timeout: float,
                 env: Mapping[str, str] | None = None) -> None:
        self._session = session
        self._hosts = list(hosts)
        self._by_name = {h.name: h for h in self._hosts}
        self._timeout = timeout
        self._env = dict(env) if env else None
        self._stdins = {h.name: DeferredStdin() for h in self._hosts}
        self._result: FanoutResult[CommandResult] | None = None
        self._steps: dict[str, _Step] = {}  # the step each host's shell runs now
        self._ended: dict[str, CommandResult | HostFailure] = {}  # shells that ended
        self._lock = threading.Lock()
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
        result = self._session.map(self._hosts, self._shell, on_done=self._shell_ended)
        self._result = FanoutResult(result.hosts, {  # each shell's own script's output
            name: dataclasses.replace(r, stdout=after_steps(r.stdout),
                                      stderr=after_steps(r.stderr))
            for name, r in result.values.items()}, result.failures)

    def _shell(self, connection: Connection) -> CommandResult:
        def on_line(stream: str, line: str) -> None:
            step = self._steps.get(connection.host)
            if step is not None:
                step.see(stream, line)

        return connection.run(BOOTSTRAP, timeout=self._timeout, env=self._env,
                              stdin=cast("BinaryIO", self._stdins[connection.host]),
                              on_line=on_line)

    def _shell_ended(self, name: str, outcome: CommandResult | HostFailure) -> None:
        with self._lock:
            self._ended[name] = outcome
            step = self._steps.get(name)
        if step is not None:
            step.done.set()  # it will not end on its own now

    def step(self, host: str) -> Connection:
        """The host's waiting shell as a Connection whose `run` is a step there."""
        return _StepConnection(self, host)

    def ask(self, host: str, script: str, timeout: float,
            on_line: LineCallback | None = None) -> CommandResult:
        """Run `script` as a step in `host`'s shell (in a subshell, reading no stdin) and
        return what it printed; the shell then waits for what comes next."""
        started = time.monotonic()
        step = _Step(on_line)
        with self._lock:
            ended = self._ended.get(host)
            if ended is None:
                self._steps[host] = step
        if ended is not None:
            raise _shell_gone(ended)
        self._stdins[host].send(framed(step_script(script)))
        finished = step.done.wait(timeout)
        with self._lock:
            self._steps.pop(host, None)
            ended = self._ended.get(host)
        if not finished:
            self._abandon(host)
            raise RemoteError(FailureKind.TIMED_OUT, f"did not finish within {timeout:g}s")
        if len(step.exit_codes) < 2:
            raise _shell_gone(ended or HostFailure(host, FailureKind.ERROR, "shell ended"))
        code = step.exit_codes["stdout"]
        stdout, stderr = ("".join(f"{line}\n" for line in step.lines[stream])
                          for stream in ("stdout", "stderr"))
        return CommandResult(host, script, int(code) if code.isdigit() else -1, stdout,
                             stderr, time.monotonic() - started)

    def _abandon(self, host: str) -> None:
        """A step out of time holds its shell: end what runs there now (the shell's
        process group on the node), not at the shell's own, longer, limit."""
        self._session.connection(self._by_name[host]).end_running()

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
        pressed = threading.Event()
        # Ctrl-C as an event: a second press must not cut the closing of the connections
        with interrupts.deferred(pressed.set):
            while self._thread.is_alive() and not pressed.is_set():
                self._thread.join(0.2)
            if pressed.is_set():
                self._session.close()
                raise Interrupted("interrupted; connections closed")
        assert self._result is not None
        return self._result


def _shell_gone(outcome: CommandResult | HostFailure) -> RemoteError:
    if isinstance(outcome, HostFailure):
        return RemoteError(outcome.kind, outcome.message)
    return RemoteError(FailureKind.ERROR, f"its shell ended (exit {outcome.exit_code}): "
                                          f"{outcome.stderr.strip()[-200:]}")


class _StepConnection:
    """A waiting shell as a Connection: `run` runs a step there (WaitingShells.ask)."""

    def __init__(self, shells: WaitingShells, host: str) -> None:
        self.host = host
        self._shells = shells

    def connect(self) -> None:
        """Nothing to open: the shell's own session does (and reports a failure)."""

    def run(self, command: str, timeout: float, sudo: bool = False,
            env: Mapping[str, str] | None = None, stdin: Stdin = None,
            on_line: LineCallback | None = None) -> CommandResult:
        if sudo or env or stdin is not None:
            raise ValueError("a waiting shell's step runs as the shell does: no sudo, env "
                             "or stdin of its own")
        return self._shells.ask(self.host, command, timeout, on_line)

    def end_running(self) -> None:
        """A step holds its whole shell: ending it ends the shell."""
        self._shells._abandon(self.host)

    def close(self) -> None:
        """The shell stays: it waits for the script that follows."""
