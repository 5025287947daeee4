"""Connecting over SSH, without a server that speaks SSH: what concurrent callers of a
connection that fails get."""

from __future__ import annotations

import contextlib
import socket
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
