"""The local connection and the pieces shared with SSH (command building, line splitting,
fan-out), exercised with real processes."""

from __future__ import annotations

import contextlib
import io
import shlex
import signal
import threading
import time
from pathlib import Path

import pytest

from gpucluster.inventory import Host
from gpucluster.remote.connection import LineSplitter, build_command
from gpucluster.remote.fanout import fan_out
from gpucluster.remote.local import LocalConnection
from gpucluster.remote.result import CommandResult, FailureKind, HostFailure, RemoteError


def test_exit_code_is_data_and_streams_are_separate() -> None:
    result = LocalConnection("here").run("echo out; echo err >&2; exit 3", timeout=10)
    assert (result.exit_code, result.ok) == (3, False)
    assert result.stdout == "out\n" and result.stderr == "err\n"
    assert result.host == "here" and result.duration_s >= 0


def test_env_values_are_quoted_not_executed(tmp_path) -> None:
    target = tmp_path / "pwned"
    hostile = f"x; touch {target}; $(touch {target}) `touch {target}`"
    result = LocalConnection("here").run('printf %s "$V"', timeout=10, env={"V": hostile})
    assert result.stdout == hostile
    assert not target.exists()


def test_bad_env_names_are_refused() -> None:
    with pytest.raises(ValueError, match="not a valid environment variable name"):
        build_command("true", {"A;touch x": "1"}, sudo=False, is_root=False)


def test_sudo_is_non_interactive_and_skipped_for_root() -> None:
    assert build_command("id", None, sudo=True, is_root=True).command == "id"
    wrapped = build_command("echo 'a b'", {"K": "v"}, sudo=True, is_root=False)
    assert wrapped.command.startswith("sudo -n -- /bin/sh -c ")
    assert shlex.split(wrapped.command)[-1].endswith("; echo 'a b'")


def test_a_sudo_password_goes_to_sudos_askpass_never_on_a_command_line(
        tmp_path: Path) -> None:
    """--ask-sudo-pass: the user's shell reads the password off stdin, sudo -A gets it
    from SUDO_ASKPASS (printenv), and the command's own env and stdin follow. sudo here
    is a stand-in that asks SUDO_ASKPASS as sudo does (the real one: test_node_users)."""
    import subprocess

    fake = tmp_path / "sudo"
    fake.write_text('#!/bin/sh\n[ "$1 $2 $4" = "-A -p --" ] || exit 90\n'
                    'answer=$("$SUDO_ASKPASS" "$3") || exit 91\n'
                    '[ "$answer" = "$EXPECTED" ] || { echo "1 incorrect password attempt" >&2;'
                    ' exit 1; }\nshift 4; exec env -u GPC_SUDO_PASSWORD "$@"\n')
    fake.chmod(0o755)
    password = "p4ss 'w$(touch x)\\rd "
    envelope = build_command('printf "%s|" "$K"; cat; printenv GPC_SUDO_PASSWORD || echo -',
                             {"K": "v"}, sudo=True, is_root=False, sudo_password=password)
    assert "p4ss" not in envelope.command
    assert envelope.stdin_prefix.startswith(f"{password}\n".encode())

    def run(expected: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["/bin/sh", "-c", envelope.command], capture_output=True,
                              input=envelope.stdin_prefix + b"payload", timeout=10, check=False,
                              env={"PATH": f"{tmp_path}:/usr/bin:/bin", "EXPECTED": expected})

    done = run(password)
    assert (done.returncode, done.stdout) == (0, b"v|payload-\n"), done.stderr
    assert run("another").returncode == 1  # the command did not run


def test_env_values_travel_on_stdin_never_on_the_command_line() -> None:
    secret = "hf_SECRET'value\nwith a newline"
    envelope = build_command("true", {"HF_TOKEN": secret, "B": ""}, sudo=True, is_root=False)
    assert "SECRET" not in envelope.command and "HF_TOKEN" not in envelope.command
    assert b"SECRET" in envelope.stdin_prefix


def test_the_command_reads_its_own_stdin_after_the_environment() -> None:
    connection = LocalConnection("here")
    env = {"A": "multi\nline 'quoted' $(touch /tmp/gpc-no)", "B": "two"}
    result = connection.run('printf "%s|%s|" "$A" "$B"; cat', timeout=10, env=env,
                            stdin=b"payload\nmore")
    assert result.stdout == f"{env['A']}|two|payload\nmore"
    assert connection.run("cat", timeout=10, env={"X": "1"}).stdout == ""  # EOF, no hang
    assert not Path("/tmp/gpc-no").exists()


@pytest.mark.parametrize("stdin", [None, b"payload\nmore"])
def test_a_script_larger_than_a_command_line_may_be_runs_from_stdin(
        stdin: bytes | None) -> None:
    """Linux takes at most 128 KiB in one argument: prune's script for 600 old jobs
    (400 KiB) failed with "Argument list too long". Past 64 KiB the script goes on stdin,
    after the environment and before the caller's own stdin, which it still reads."""
    lines = [f"total=$((total + {n})); : '{'x' * 30}'" for n in range(8000)]
    script = "total=0\n" + "\n".join(lines) + '\nprintf "%s|%s|" "$total" "$A"; cat'
    assert len(script) > 128 * 1024
    result = LocalConnection("here").run(script, timeout=60, env={"A": "a'b"}, stdin=stdin)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"{sum(range(8000))}|a'b|" + (stdin or b"").decode()
    envelope = build_command(script, None, sudo=True, is_root=False, stdin_follows=False)
    assert len(envelope.command) < 1000 and envelope.stdin_prefix == script.encode()


def test_env_values_are_not_in_the_process_list(tmp_path: Path) -> None:
    marker = tmp_path / "argv"
    LocalConnection("here").run(f"cat /proc/$$/cmdline > {marker}; cat /proc/$PPID/cmdline "
                                f">> {marker}", timeout=10, env={"TOKEN": "hunter2-secret"})
    assert b"hunter2" not in marker.read_bytes()


def test_stdin_bytes_and_streamed_file() -> None:
    connection = LocalConnection("here")
    assert connection.run("cat", timeout=10, stdin=b"hello").stdout == "hello"
    big = io.BytesIO(b"x" * (5 * 1024 * 1024 + 7))  # several chunks
    result = connection.run("wc -c", timeout=30, stdin=big)
    assert result.stdout.strip() == str(5 * 1024 * 1024 + 7)


def test_lines_are_streamed_while_the_command_runs() -> None:
    seen: list[tuple[float, str, str]] = []
    started = time.monotonic()
    LocalConnection("here").run(
        "echo first; sleep 1; echo second >&2; printf tail", timeout=10,
        on_line=lambda stream, line: seen.append((time.monotonic() - started, stream, line)))
    assert [(s, line) for _, s, line in seen] == [
        ("stdout", "first"), ("stderr", "second"), ("stdout", "tail")]
    assert seen[0][0] < seen[1][0] - 0.5  # the first line arrived before the sleep ended


def test_timeout_kills_the_whole_process_group() -> None:
    with pytest.raises(RemoteError) as caught:
        LocalConnection("here").run("sleep 30 & sleep 30; wait", timeout=0.5)
    assert caught.value.kind is FailureKind.TIMED_OUT


@pytest.mark.parametrize(("command", "ended_by"), [
    ("sleep 30 & echo $!; wait", signal.SIGTERM),
    ("trap '' TERM; sleep 30 & echo $!; wait", signal.SIGKILL),  # the sleep ignores it too
])
def test_end_running_ends_a_command_and_all_it_started(command: str,
                                                       ended_by: signal.Signals) -> None:
    connection = LocalConnection("here")
    started = threading.Event()
    outcome: list[CommandResult] = []
    worker = threading.Thread(target=lambda: outcome.append(connection.run(
        command, timeout=60, on_line=lambda _stream, _line: started.set())))
    worker.start()
    assert started.wait(10)
    connection.end_running()
    worker.join(10)
    assert outcome and outcome[0].exit_code == -ended_by
    child = Path(f"/proc/{outcome[0].stdout.strip()}/stat")

    def ended() -> bool:
        with contextlib.suppress(FileNotFoundError):
            return child.read_text().split(") ")[1].startswith("Z")
        return True
    # The group's signal is sent, not waited for: on a loaded box the child was seen
    # still running (state R, its SIGKILL pending) the moment the shell's end came back.
    deadline = time.monotonic() + 5
    while not ended() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ended()


def test_line_splitter_handles_partial_lines_and_bad_utf8() -> None:
    lines: list[str] = []
    splitter = LineSplitter("stdout", lambda _stream, line: lines.append(line))
    for chunk in (b"ab", b"c\r\nde", b"\xff\n", b"end"):
        splitter.feed(chunk)
    assert splitter.finish() == "abc\r\nde\ufffd\nend"
    assert lines == ["abc", "de\ufffd", "end"]


def _hosts(count: int) -> list[Host]:
    return [Host(name=f"h{i}", address=f"h{i}", user="u") for i in range(count)]


def test_fan_out_keeps_going_past_failures_and_bounds_parallelism() -> None:
    running = 0
    peak = 0
    lock = threading.Lock()

    def task(host: Host) -> str:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)
        with lock:
            running -= 1
        if host.name == "h3":
            raise RemoteError(FailureKind.UNREACHABLE, "no route")
        if host.name == "h5":
            raise KeyError("a bug")
        return host.name.upper()

    done: list[str] = []
    result = fan_out(_hosts(12), task, parallelism=4,
                     on_done=lambda name, outcome: done.append(name))
    assert peak <= 4
    assert result.hosts == tuple(f"h{i}" for i in range(12))
    assert result.failed_hosts == ["h3", "h5"]
    assert result.failures["h3"] == HostFailure("h3", FailureKind.UNREACHABLE, "no route")
    assert result.failures["h5"].kind is FailureKind.ERROR
    assert result.values["h0"] == "H0" and len(result.values) == 10
    assert sorted(done) == sorted(result.hosts)


def test_captured_output_keeps_a_bounded_tail_and_says_it_was_cut() -> None:
    splitter = LineSplitter("stdout", None, keep_bytes=1000)
    for index in range(100):
        splitter.feed(f"{index:03d}".encode() * 25 + b"\n")  # 76 bytes a line
    text = splitter.finish()
    first, _, rest = text.partition("\n")
    # whole chunks are dropped from the front while the rest fits: 13 lines of 76 bytes
    assert first == "[gpucluster: the first 6612 bytes of stdout were cut; the last 988 follow]"
    assert rest.endswith("099" * 25 + "\n") and len(rest) == 988
    big = LineSplitter("stderr", None, keep_bytes=10)
    big.feed(b"x" * 100 + b"0123456789")
    assert big.finish().endswith("]\n0123456789")


def test_a_flood_without_newlines_is_linear_and_streamed_in_pieces() -> None:
    lines: list[str] = []
    splitter = LineSplitter("stdout", lambda _s, line: lines.append(line), keep_bytes=1 << 20)
    for _ in range(4000):  # 64 MiB of one endless "line", as a \r progress bar makes
        splitter.feed(b"\r 42%|####" * 1638)
        assert len(splitter._partial) <= 2 * 1024 * 1024  # never re-joined whole
    splitter.finish()
    assert sum(len(line) for line in lines) > 60_000_000
    assert max(len(line) for line in lines) <= 2 * 1024 * 1024


def test_a_flooding_command_costs_bounded_memory() -> None:
    result = LocalConnection("here").run("head -c 100000000 /dev/zero | tr '\\0' x",
                                         timeout=60)
    assert len(result.stdout) < 17 * 1024 * 1024 and "were cut" in result.stdout


def test_known_hosts_markers_and_bad_lines_do_not_break_verification(tmp_path: Path) -> None:
    import paramiko

    from gpucluster.remote import hostkeys

    key_a = paramiko.RSAKey.generate(1024)
    key_b = paramiko.RSAKey.generate(1024)
    user = tmp_path / "known_hosts"
    user.write_text(
        "# comment\n"
        f"@cert-authority *.example.com ssh-rsa {key_b.get_base64()}\n"
        f"@revoked * ssh-rsa {key_b.get_base64()}\n"
        "garbage line that is no key\n"
        f"node1,10.0.0.1 ssh-rsa {key_a.get_base64()}\n")
    system = tmp_path / "ssh_known_hosts"
    system.write_text(f"[node2]:2222 ssh-rsa {key_a.get_base64()}\n")
    table = paramiko.HostKeys()
    revoked = hostkeys.load_known_hosts(table, [user, system, tmp_path / "absent"])
    assert revoked == {key_b.get_base64()}
    assert table.lookup("10.0.0.1")["ssh-rsa"] == key_a
    assert table.lookup("[node2]:2222")["ssh-rsa"] == key_a
    policy = hostkeys.make_policy(user, accept_new=True, label="node3", revoked=revoked)
    with pytest.raises(RemoteError, match="HOST KEY REVOKED"):
        policy.missing_host_key(None, "node3", key_b)  # type: ignore[arg-type]
    assert key_b.get_base64() not in user.read_text().splitlines()[-1]  # not recorded


def test_a_command_a_signal_ended_carries_the_signals_name() -> None:
    killed = LocalConnection("here").run("kill -KILL $$", timeout=10)
    assert (killed.signal, killed.killed, killed.ending) == ("KILL", True, "killed by SIGKILL")
    realtime = LocalConnection("here").run("kill -35 $$", timeout=10)  # no name in Python
    assert realtime.ending == "killed by SIG35"
    exited = LocalConnection("here").run("exit 3", timeout=10)
    assert (exited.signal, exited.killed, exited.ending) == (None, False, "exit 3")


def test_a_commands_last_word_is_its_last_line_of_stderr_else_how_it_ended() -> None:
    said = LocalConnection("here").run("echo why >&2; echo 'the reason' >&2; echo >&2; "
                                       "exit 1", timeout=10)
    assert said.last_word == "the reason"
    assert LocalConnection("here").run("echo out; exit 4", timeout=10).last_word == "exit 4"
    assert LocalConnection("here").run("kill -KILL $$", timeout=10).last_word == \
        "killed by SIGKILL"
