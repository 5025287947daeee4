"""The local machine as a host: same interface as SSH, run with /bin/sh, no network."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from gpucluster.remote.connection import (
    LineCallback,
    LineSplitter,
    Stdin,
    build_command,
    stdin_chunks,
    timed_out,
)
from gpucluster.remote.result import CommandResult

END_GRACE_S = 1.0  # between TERM and KILL, as over SSH


class LocalConnection:
    """Runs commands on this machine, each in its own process group."""

    def __init__(self, host: str, sudo_password: str | None = None) -> None:
        self.host = host
        self._sudo_password = sudo_password
        self._running: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()

    def connect(self) -> None:
        """Nothing to open: each command is its own process."""

    def run(
        self,
        command: str,
        timeout: float,
        sudo: bool = False,
        env: Mapping[str, str] | None = None,
        stdin: Stdin = None,
        on_line: LineCallback | None = None,
    ) -> CommandResult:
        envelope = build_command(command, env, sudo, is_root=os.geteuid() == 0,
                                 sudo_password=self._sudo_password,
                                 stdin_follows=stdin is not None)
        feeds = stdin is not None or bool(envelope.stdin_prefix)
        started = time.monotonic()
        process = subprocess.Popen(
            ["/bin/sh", "-c", envelope.command],
            stdin=subprocess.PIPE if feeds else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # so a timeout can end the whole process group
            cwd=_home(),
        )
        with self._lock:
            self._running.add(process)
        if feeds:
            assert process.stdin is not None
            threading.Thread(target=_feed, args=(process.stdin, stdin, envelope.stdin_prefix),
                             daemon=True).start()
        assert process.stdout is not None and process.stderr is not None
        splitters = {process.stdout: LineSplitter("stdout", on_line),
                     process.stderr: LineSplitter("stderr", on_line)}
        deadline = started + timeout
        try:
            _pump(splitters, deadline)
            # Output closed; a child that keeps running detached still gets the deadline.
            exit_code = process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill_group(process)
            raise timed_out(*splitters.values()) from None
        except BaseException:
            _kill_group(process)
            raise
        finally:
            with self._lock:
                self._running.discard(process)
        return CommandResult(
            host=self.host,
            command=command,
            exit_code=exit_code,
            stdout=splitters[process.stdout].finish(),
            stderr=splitters[process.stderr].finish(),
            duration_s=time.monotonic() - started,
            signal=_signal_name(-exit_code) if exit_code < 0 else None,
        )

    def end_running(self) -> None:
        with self._lock:
            running = list(self._running)
        for process in running:
            _signal_group(process, signal.SIGTERM)
        for process in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(END_GRACE_S)
            _kill_group(process)

    def close(self) -> None:
        """Nothing to close: each command is its own process."""


def _pump(splitters: dict[IO[bytes], LineSplitter], deadline: float) -> None:
    with selectors.DefaultSelector() as selector:
        for pipe in splitters:
            selector.register(pipe, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise timed_out(*splitters.values())
            for key, _ in selector.select(min(remaining, 1.0)):
                data = os.read(key.fd, 65536)
                if data:
                    splitters[key.fileobj].feed(data)  # type: ignore[index]
                else:
                    selector.unregister(key.fileobj)


def _home() -> str:
    """Where the command runs: the user's home, as sshd starts it (or / where there is
    none), so a relative path means the same on this machine as over SSH, and never
    whatever directory gpucluster was started in."""
    home = Path("~").expanduser()
    return str(home) if home.is_dir() else "/"


def _feed(pipe: IO[bytes], stdin: Stdin, prefix: bytes) -> None:
    try:
        for chunk in stdin_chunks(stdin, prefix):
            pipe.write(chunk)
            pipe.flush()  # now: a paced stdin (remote/waiting.py) waits between chunks
    except BrokenPipeError:
        pass  # the command stopped reading; its exit code tells the story
    finally:
        with contextlib.suppress(BrokenPipeError):
            pipe.close()


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    _signal_group(process, signal.SIGKILL)
    process.wait()


def _signal_group(process: subprocess.Popen[bytes], which: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, which)


def _signal_name(number: int) -> str:
    """`KILL`, as sshd names signals in exit-signal; a real-time one has no name: `35`."""
    try:
        return signal.Signals(number).name.removeprefix("SIG")
    except ValueError:
        return str(number)
