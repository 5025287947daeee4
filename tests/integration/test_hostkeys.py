"""Host keys are verified against known_hosts; unknown is refused unless accepted, a
changed key is always refused."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cli import gpucluster
from tests.sandbox import Sandbox

pytestmark = pytest.mark.sandbox


def _with_known_hosts(sandbox: Sandbox, tmp_path: Path, known_hosts: Path) -> Path:
    cluster = {**sandbox.data["cluster"], "known_hosts": str(known_hosts)}
    return sandbox.write_inventory(tmp_path / "inventory.yaml", cluster=cluster)


def test_unknown_hosts_are_refused_then_accepted_on_request(sandbox: Sandbox,
                                                            tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("# the user's own line, kept\n")
    inventory = _with_known_hosts(sandbox, tmp_path, known_hosts)

    refused = gpucluster("run", "-i", str(inventory), "--json", "hostname")
    assert refused.code == 1
    for host in refused.json()["hosts"]:
        assert host["error"]["kind"] == "host key unknown"
        assert "--accept-new-host-keys" in host["error"]["message"]
    assert known_hosts.read_text() == "# the user's own line, kept\n"

    accepted = gpucluster("run", "-i", str(inventory), "--accept-new-host-keys", "hostname")
    assert accepted.code == 0, accepted.stderr
    lines = known_hosts.read_text().splitlines()
    assert lines[0] == "# the user's own line, kept"
    recorded = {line.split()[0] for line in lines[1:]}
    assert recorded == set(sandbox.addresses.values())

    again = gpucluster("run", "-i", str(inventory), "hostname")
    assert again.code == 0, again.stderr
    assert len(known_hosts.read_text().splitlines()) == len(lines)


def test_a_changed_host_key_is_refused_whatever_the_flags(sandbox: Sandbox,
                                                          tmp_path: Path) -> None:
    impostor = tmp_path / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(impostor)],
                   check=True)
    original = Path(sandbox.data["cluster"]["known_hosts"]).read_text().splitlines()
    key_type, key = Path(f"{impostor}.pub").read_text().split()[:2]
    lines = [f"{line.split()[0]} {key_type} {key}" if line.startswith("node1,") else line
             for line in original]
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("\n".join(lines) + "\n")
    inventory = _with_known_hosts(sandbox, tmp_path, known_hosts)

    result = gpucluster("run", "-i", str(inventory), "--json", "--accept-new-host-keys",
                        "hostname")
    assert result.code == 1
    by_host = {h["host"]: h for h in result.json()["hosts"]}
    assert by_host["node1"]["error"]["kind"] == "host key changed"
    assert "HOST KEY CHANGED" in by_host["node1"]["error"]["message"]
    assert "man-in-the-middle" in by_host["node1"]["error"]["message"]
    assert all(by_host[n]["ok"] for n in ("node2", "node3", "node4"))
    assert known_hosts.read_text() == "\n".join(lines) + "\n"


def test_a_revoked_key_is_refused_and_a_cert_authority_line_breaks_nothing(
        sandbox: Sandbox, tmp_path: Path) -> None:
    original = Path(sandbox.data["cluster"]["known_hosts"]).read_text().splitlines()
    node2 = next(line for line in original if line.startswith("node2,"))
    ca = tmp_path / "ca"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ca)], check=True)
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"@cert-authority *.example.com {Path(f'{ca}.pub').read_text()}"
                           f"@revoked * {' '.join(node2.split()[1:3])}\n"
                           + "\n".join(original) + "\n")
    inventory = _with_known_hosts(sandbox, tmp_path, known_hosts)
    result = gpucluster("run", "-i", str(inventory), "--json", "--accept-new-host-keys",
                        "hostname")
    assert result.code == 1, result.stderr
    by_host = {h["host"]: h for h in result.json()["hosts"]}
    assert "HOST KEY REVOKED" in by_host["node2"]["error"]["message"]
    assert all(by_host[n]["ok"] for n in ("node1", "node3", "node4"))  # the rest verified
