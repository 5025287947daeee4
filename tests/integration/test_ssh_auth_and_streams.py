"""Authentication failures fail fast with a reason; passwords are never shown; large
stdin streams over SSH without being held in memory; output streams line by line."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucluster import inventory as inventory_module
from gpucluster.remote.session import Session
from gpucluster.remote.ssh import SshOptions
from tests.cli import gpucluster
from tests.sandbox import Sandbox

pytestmark = pytest.mark.sandbox


def _keygen(path: Path, passphrase: str = "") -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-f", str(path)],
                   check=True)
    return path


def _inventory_with_key(sandbox: Sandbox, tmp_path: Path, key: Path) -> Path:
    defaults = {**sandbox.data["defaults"], "identity_file": str(key)}
    return sandbox.write_inventory(tmp_path / "inventory.yaml", defaults=defaults)


def test_passphrase_protected_key_fails_fast_naming_ssh_agent(sandbox: Sandbox,
                                                             tmp_path: Path) -> None:
    key = _keygen(tmp_path / "locked", passphrase="correct horse")
    inventory = _inventory_with_key(sandbox, tmp_path, key)
    result = gpucluster("run", "-i", str(inventory), "--json", "--hosts", "node1", "true",
                        timeout=30, env={"SSH_AUTH_SOCK": ""})
    error = result.json()["hosts"][0]["error"]
    assert error["kind"] == "auth failed"
    assert "passphrase-protected" in error["message"] and "ssh-add" in error["message"]


def test_unauthorized_key_is_auth_failed(sandbox: Sandbox, tmp_path: Path) -> None:
    inventory = _inventory_with_key(sandbox, tmp_path, _keygen(tmp_path / "stranger"))
    result = gpucluster("run", "-i", str(inventory), "--json", "true", timeout=30)
    assert result.code == 1
    for host in result.json()["hosts"]:
        assert host["error"]["kind"] == "auth failed"
        assert "root@198.19.0." in host["error"]["message"]


@pytest.fixture
def node4_with_password(sandbox: Sandbox) -> str:
    password = "s3cret-never-printed"
    config = "/etc/ssh/sshd_config"
    sandbox.node_exec("node4", f"echo 'root:{password}' | chpasswd && sed -i "
                      f"-e 's/^PasswordAuthentication no/PasswordAuthentication yes/' "
                      f"-e 's/^PermitRootLogin prohibit-password/PermitRootLogin yes/' {config}")
    sandbox.node_exec("node4", f"kill -HUP {sandbox.sshd_pid('node4')}")
    yield password
    sandbox.node_exec("node4", f"passwd -d root >/dev/null && sed -i "
                      f"-e 's/^PasswordAuthentication yes/PasswordAuthentication no/' "
                      f"-e 's/^PermitRootLogin yes/PermitRootLogin prohibit-password/' {config}")
    sandbox.node_exec("node4", f"kill -HUP {sandbox.sshd_pid('node4')}")


def test_ask_pass_logs_in_with_a_password_it_never_prints(
        sandbox: Sandbox, tmp_path: Path, node4_with_password: str) -> None:
    hosts = [{"name": "node4", "address": sandbox.addresses["node4"], "user": "root"}]
    inventory = sandbox.write_inventory(tmp_path / "password.yaml", hosts=hosts,
                                        defaults={})
    env = {**os.environ, "SSH_AUTH_SOCK": "", "HOME": str(tmp_path)}  # no agent, no keys
    without = subprocess.run(
        [sys.executable, "-m", "gpucluster", "run", "-i", str(inventory), "--json", "hostname"],
        capture_output=True, text=True, timeout=30, env=env, check=False)
    assert '"auth failed"' in without.stdout

    for password, expected in [("wrong-password", "auth failed"), (node4_with_password, None)]:
        done = subprocess.run(
            [sys.executable, "-m", "gpucluster", "run", "-i", str(inventory), "--ask-pass",
             "hostname"], input=password + "\n", capture_output=True, text=True, timeout=30,
            env=env, check=False)
        assert password not in done.stdout + done.stderr
        assert "Warning" not in done.stderr  # piped input is read plainly, no getpass noise
        if expected is None:
            assert done.returncode == 0, done.stderr
            assert "node4" in done.stdout
        else:
            assert done.returncode == 1 and expected in done.stdout + done.stderr


def test_large_stdin_streams_over_ssh_and_lines_arrive_as_they_come(sandbox: Sandbox) -> None:
    loaded = inventory_module.load(sandbox.inventory)
    payload = os.urandom(24 * 1024 * 1024)
    lines: list[tuple[str, str, str]] = []
    with Session(loaded, SshOptions(known_hosts=Path(loaded.cluster.known_hosts))) as session:
        connection = session.connection(loaded.host("node2"))
        result = connection.run("sha256sum", timeout=60, stdin=io.BytesIO(payload))
        assert result.stdout.split()[0] == hashlib.sha256(payload).hexdigest()
        streamed = session.run(loaded.hosts[:2], "echo one; echo two >&2; echo three",
                               on_line=lambda host, stream, line: lines.append(
                                   (host, stream, line)))
    assert not streamed.failures
    for host in ("node1", "node2"):  # the two streams may interleave either way
        assert [t for h, s, t in lines if h == host and s == "stdout"] == ["one", "three"]
        assert [t for h, s, t in lines if h == host and s == "stderr"] == ["two"]
