"""Shells that log in ahead of time (remote/waiting.py), with real local shells."""

from __future__ import annotations

import io
import signal
import threading
import time
from pathlib import Path

import pytest

from gpucluster.inventory import load
from gpucluster.remote.local import LocalConnection
from gpucluster.remote.result import FailureKind, RemoteError
from gpucluster.remote.session import Session
from gpucluster.remote.ssh import SshOptions
from gpucluster.remote.waiting import BOOTSTRAP, DeferredStdin, WaitingShells, framed


def test_the_bootstrap_runs_the_framed_script_and_leaves_it_the_rest_of_stdin() -> None:
    # Backslashes, quotes, blank lines and a last line without a newline survive.
    script = 'printf "%s|" "a\\\\b" \'$HOME\'\n\necho; cat; echo "[$GREETING]"'
    stdin = io.BytesIO(framed(script) + b"the rest\n")
    result = LocalConnection("here").run(BOOTSTRAP, timeout=10, env={"GREETING": "hi"},
                                         stdin=stdin)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "a\\b|$HOME|\nthe rest\n[hi]\n"  # sh's "\\" is one \


def test_the_bootstrap_sent_nothing_ends_quietly_without_running_anything() -> None:
    result = LocalConnection("here").run(BOOTSTRAP, timeout=10, stdin=b"")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", "")


def test_a_deferred_stdin_holds_its_reader_until_given() -> None:
    stdin = DeferredStdin()
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(stdin.read1(4)))
    reader.start()
    time.sleep(0.2)
    assert reader.is_alive() and got == []
    stdin.give(b"script", io.BytesIO(b"stream"))
    reader.join(5)
    assert got == [b"scri"]
    assert stdin.read1(100) == b"pt" and stdin.read1(100) == b"stream"
    assert stdin.read1(100) == b""


def _local_session(tmp_path: Path) -> Session:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("hosts:\n  - name: a\n    address: localhost\n"
                         "  - name: b\n    address: 127.0.0.1\n")
    return Session(load(inventory), SshOptions(tmp_path / "known_hosts"))


def test_waiting_shells_run_what_each_host_is_sent_and_nothing_elsewhere(tmp_path: Path
                                                                        ) -> None:
    session = _local_session(tmp_path)
    with WaitingShells(session, session.inventory.hosts, timeout=30,
                       env={"JOB": "j1"}) as shells:
        time.sleep(0.3)  # the shells are up and waiting, with nothing to run yet
        ran = shells.run({"a": ("echo \"$JOB\"; cat", io.BytesIO(b"files"))})
    assert not ran.failures
    assert ran.values["a"].stdout == "j1\nfiles"
    assert ran.values["b"].exit_code == 0 and ran.values["b"].stdout == ""


def test_leaving_the_block_without_a_run_ends_every_shell(tmp_path: Path) -> None:
    session = _local_session(tmp_path)
    # Far longer than the block waits for them on its way out: only their stdin's end
    # can have ended them.
    with WaitingShells(session, session.inventory.hosts, timeout=300) as shells:
        pass
    assert not shells._thread.is_alive()


def test_a_deferred_stdin_sends_what_it_has_then_waits_for_more_or_its_end() -> None:
    stdin = DeferredStdin(b"script\n")
    assert stdin.read1(100) == b"script\n"  # at once: nothing to wait for
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(stdin.read1(100)))
    reader.start()
    time.sleep(0.2)
    assert reader.is_alive() and got == []  # waits for the caller's next word
    stdin.send(b"go\n")
    reader.join(5)
    assert got == [b"go\n"]
    stdin.cancel()
    assert stdin.read1(100) == b""  # the end, and it stays the end
    stdin.send(b"too late\n")
    assert stdin.read1(100) == b""


def test_a_step_runs_in_the_shell_that_then_runs_the_script(tmp_path: Path) -> None:
    session = _local_session(tmp_path)
    seen: list[tuple[str, str]] = []
    with WaitingShells(session, session.inventory.hosts, timeout=30,
                       env={"JOB": "j1"}) as shells:
        # The step reads nothing of the shell's stdin (the script comes there next),
        # and its exit ends only its own subshell.
        # Its last line may lack a newline.
        step = shells.step("a").run('echo "$JOB $$"; echo note >&2; cat; printf "no newline"; '
                                    'exit 3', timeout=10,
                                    on_line=lambda stream, line: seen.append((stream, line)))
        ran = shells.run({"a": ('echo "$$"; cat', io.BytesIO(b"files"))})
    assert (step.exit_code, step.stderr) == (3, "note\n")
    first, last = step.stdout.splitlines()
    job, shell_pid = first.split()
    assert job == "j1" and last == "no newline"
    assert ("stderr", "note") in seen and ("stdout", first) in seen
    assert ran.values["a"].stdout == f"{shell_pid}\nfiles"  # one shell; the step's left out
    assert ran.values["a"].stderr == ""


def test_a_step_out_of_time_or_whose_shell_ended_is_a_remote_error(tmp_path: Path) -> None:
    session = _local_session(tmp_path)
    with WaitingShells(session, session.inventory.hosts, timeout=30) as shells:
        with pytest.raises(RemoteError) as late:
            shells.step("a").run("sleep 20", timeout=0.2)
        with pytest.raises(RemoteError) as gone:
            shells.step("b").run("kill -KILL $$", timeout=10)  # $$: the shell itself
        ran = shells.run({})
    assert late.value.kind is FailureKind.TIMED_OUT
    # Ended then, with its shell: not left to finish its sleep and wait for a script.
    assert ran.values["a"].exit_code == -signal.SIGTERM
    assert "shell ended" in gone.value.message
    assert ran.values["b"].exit_code != 0


def test_closing_the_session_ends_what_runs_on_a_local_host(tmp_path: Path) -> None:
    """Ctrl-C closes the session: a command on a host reached without SSH ends then too,
    not at its own time limit."""
    session = _local_session(tmp_path)
    started = threading.Event()
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(session.connection(session.inventory.hosts[0]).run(
                "echo up; sleep 30", timeout=60, on_line=lambda _s, _l: started.set()))
        except RemoteError as error:
            outcome.append(error)

    worker = threading.Thread(target=run)
    worker.start()
    assert started.wait(10)
    session.close()
    worker.join(10)
    assert not worker.is_alive()
    assert getattr(outcome[0], "exit_code", None) == -signal.SIGTERM


def test_ctrl_c_pressed_twice_during_a_run_closes_every_shell_and_says_so(
        tmp_path: Path) -> None:
    """The second press used to land inside the handling of the first and cut the
    closing of the connections short."""
    import os

    from gpucluster.errors import Interrupted

    session = _local_session(tmp_path)

    def press_twice() -> None:
        time.sleep(0.5)
        for _ in range(2):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)

    presser = threading.Thread(target=press_twice)
    started = time.monotonic()
    with WaitingShells(session, session.inventory.hosts, timeout=60) as shells:
        presser.start()
        with pytest.raises(Interrupted, match="interrupted; connections closed"):
            shells.run({h.name: ("sleep 30", None) for h in session.inventory.hosts})
    presser.join()
    assert time.monotonic() - started < 10  # the sleeps ended with their shells
