"""Connecting over SSH, without a server that speaks SSH: what concurrent callers of a
connection that fails get."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from gpucluster.remote.result import RemoteError
from gpucluster.remote.ssh import Endpoint, SshConnection, SshOptions


def test_callers_waiting_on_a_failed_connect_share_its_failure_and_later_ones_retry(
        tmp_path: Path) -> None:
    """A server that accepts and never greets: the connect fails at its timeout. Two
    callers at once make one attempt, not two waits in a row; a later caller tries again."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                accepted.append(server.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    connection = SshConnection(
        Endpoint("mute", "127.0.0.1", server.getsockname()[1], "nobody"),
        SshOptions(known_hosts=tmp_path / "known_hosts", connect_timeout=1.0))
    failures: list[str] = []

    def connect() -> None:
        try:
            connection.connect()
        except RemoteError as error:
            failures.append(error.kind.value)

    callers = [threading.Thread(target=connect) for _ in range(2)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(10)
    assert len(failures) == 2 and len(set(failures)) == 1, failures
    assert len(accepted) == 1  # one attempt for both
    connect()
    assert len(failures) == 3 and len(accepted) == 2  # asked after it failed: tried again
    server.close()
    for peer in accepted:
        peer.close()


def test_a_server_that_hangs_up_before_its_banner_is_one_line_not_paramikos_traceback(
        tmp_path: Path) -> None:
    """sshd past MaxStartups, or a port that is not sshd's, closes before greeting.
    paramiko logs that from its transport thread, traceback and all, at ERROR; with no
    handler set up Python's last resort printed it to stderr, beside our own report of
    the same failure, twice per host. In a process of its own: pytest's log capture
    would be the handler here."""
    script = textwrap.dedent(f"""
        import socket, threading
        from pathlib import Path
        from gpucluster.remote.result import RemoteError
        from gpucluster.remote.ssh import Endpoint, SshConnection, SshOptions

        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(8)

        def hang_up():
            while True:
                server.accept()[0].close()

        threading.Thread(target=hang_up, daemon=True).start()
        connection = SshConnection(
            Endpoint("rude", "127.0.0.1", server.getsockname()[1], "nobody"),
            SshOptions(known_hosts=Path({str(tmp_path / "known_hosts")!r}),
                       connect_timeout=5.0))
        try:
            connection.connect()
        except RemoteError as error:
            print(error.kind.value, "|", error)
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=False)
    kind, _, said = done.stdout.strip().partition(" | ")
    assert kind == "unreachable" and "took the connection but never spoke SSH: not " \
        "sshd's port, or sshd turning this address away" in said, done
    assert done.stderr == "", done.stderr


def test_a_missing_identity_file_is_named_before_any_connection(tmp_path: Path) -> None:
    """paramiko said `cannot connect to ...: No such file or directory`, as if the host
    were unreachable. A key that exists is offered alone, as OpenSSH skips a missing one."""
    missing = tmp_path / "id_typo"
    connection = SshConnection(
        Endpoint("n1", "192.0.2.1", 22, "ubuntu", str(missing)),
        SshOptions(known_hosts=tmp_path / "known_hosts", connect_timeout=0.5))
    try:
        connection.connect()
    except RemoteError as error:
        assert error.kind.value == "auth failed"
        assert error.message == (f"identity file {missing} does not exist (fix: set "
                                 f"identity_file in the inventory to your private key)")
    else:
        raise AssertionError("connected without a key")
    present = tmp_path / "id_present"
    present.write_text("")
    both = Endpoint("n1", "192.0.2.1", 22, "ubuntu", str(missing),
                    (str(missing), str(present)))
    assert SshConnection(both, SshOptions(known_hosts=tmp_path / "kh")).identities() == [
        str(present)]
