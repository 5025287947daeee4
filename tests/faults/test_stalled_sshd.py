"""Fault: an sshd that accepts the connection and the key, then never starts the command
(a hung PAM module or login script). A real SSH server on loopback plays it; the host is
reached as 127.0.0.1 with a port, so over SSH with its host key checked, not locally."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
import yaml

from tests.cli import gpucluster


class _Stalling(paramiko.ServerInterface):
    def __init__(self, release: threading.Event) -> None:
        self.release = release

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        self.release.wait(60)  # the command is never started while the test runs
        return False


@pytest.fixture
def stalling_sshd(tmp_path: Path) -> Iterator[tuple[int, paramiko.PKey]]:
    host_key = paramiko.RSAKey.generate(2048)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.2)
    release, stop = threading.Event(), threading.Event()
    transports: list[paramiko.Transport] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            transport = paramiko.Transport(client)
            transport.add_server_key(host_key)
            transport.start_server(server=_Stalling(release))
            transports.append(transport)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], host_key
    finally:
        stop.set()
        release.set()
        thread.join(5)
        for transport in transports:
            transport.close()
        listener.close()


def test_a_command_sshd_never_starts_is_a_timeout_not_a_hang(
        stalling_sshd: tuple[int, paramiko.PKey], tmp_path: Path) -> None:
    port, host_key = stalling_sshd
    identity = tmp_path / "id_rsa"
    paramiko.RSAKey.generate(2048).write_private_key_file(str(identity))
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} ssh-rsa {host_key.get_base64()}\n")
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({
        "cluster": {"known_hosts": str(known_hosts), "connect_timeout": 3},
        "hosts": [{"name": "stalled", "address": "127.0.0.1", "port": port,
                   "user": "nobody", "identity_file": str(identity)}]}))
    # Without a deadline on the exec request, this waited for ever (the test's own 60 s
    # limit would fail it).
    result = gpucluster("run", "-i", str(inventory), "--json", "true", timeout=60)
    assert result.code == 1, result.stderr
    (host,) = result.json()["hosts"]
    assert host["error"]["kind"] == "timed out"
    assert "did not start the command within 3s" in host["error"]["message"]
