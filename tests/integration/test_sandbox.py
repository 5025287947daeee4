"""The sandbox itself: isolation between nodes, simulated GPUs, shaping, and a `down`
that leaves nothing behind."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cli import gpucluster
from tests.sandbox import NAME, SUBNET, Sandbox

pytestmark = pytest.mark.sandbox

LIFE = "gpclife"
LIFE_SUBNET = "198.19.1.0/24"
HOME_MARKER = "~/.gpucluster-test-home-marker"


def _run_json(inventory: Path, command: str) -> dict[str, dict]:
    result = gpucluster("run", "-i", str(inventory), "--json", command)
    return {h["host"]: h for h in result.json()["hosts"]}


def test_each_node_has_its_own_files_hostname_and_host_key(sandbox: Sandbox) -> None:
    sandbox.node_exec("node1", "echo only-on-node1 > /srv/marker")
    hosts = _run_json(sandbox.inventory, "hostname; cat /srv/marker 2>/dev/null; "
                      "cat /etc/hostname; cat /etc/ssh/ssh_host_ed25519_key.pub; "
                      "grep -c . /root/.ssh/authorized_keys")
    outputs = {node: hosts[node]["stdout"].splitlines() for node in sandbox.nodes}
    assert outputs["node1"][:3] == ["node1", "only-on-node1", "node1"]
    assert outputs["node2"][:2] == ["node2", "node2"]  # no marker on node2
    host_keys = {lines[-2] for lines in outputs.values()}
    assert len(host_keys) == len(sandbox.nodes)
    # The controller's own machine is untouched by what nodes write there.
    assert not Path("/srv/marker").exists()


def test_each_node_has_its_own_dev_shm(sandbox: Sandbox) -> None:
    """As each server has: doctor's shm fix (a remount) tried on one node resized the
    host's /dev/shm, and every node's with it."""
    before = subprocess.run(["df", "--output=size", "/dev/shm"], capture_output=True,
                            text=True, check=True).stdout
    sandbox.node_exec("node1", "mount -o remount,size=64M /dev/shm && "
                               "echo only-on-node1 > /dev/shm/gpc-marker")
    try:
        hosts = _run_json(sandbox.inventory, "df --output=size -k /dev/shm | tail -1; "
                          "cat /dev/shm/gpc-marker 2>/dev/null || true")
        assert hosts["node1"]["stdout"].split() == ["65536", "only-on-node1"]
        assert hosts["node2"]["stdout"].split()[0] != "65536"
        assert "only-on-node1" not in hosts["node2"]["stdout"]
        assert not Path("/dev/shm/gpc-marker").exists()
        assert subprocess.run(["df", "--output=size", "/dev/shm"], capture_output=True,
                              text=True, check=True).stdout == before
    finally:
        sandbox.node_exec("node1", "rm -f /dev/shm/gpc-marker")


def test_nodes_start_bare_knowing_only_their_own_name(sandbox: Sandbox) -> None:
    hosts = _run_json(sandbox.inventory, "getent hosts node1 node2 || true")
    assert sandbox.addresses["node1"] in hosts["node1"]["stdout"]
    assert "node2" not in hosts["node1"]["stdout"]


def test_simulated_gpus_answer_like_nvidia_smi(sandbox: Sandbox) -> None:
    hosts = _run_json(sandbox.inventory, "nvidia-smi --query-gpu=index,name,driver_version,"
                      "memory.total --format=csv,noheader,nounits")
    for node in sandbox.nodes:
        rows = hosts[node]["stdout"].strip().splitlines()
        assert len(rows) == 8
        assert rows[0] == "0, NVIDIA H100 80GB HBM3, 590.48.01, 81559"


def test_staged_mismatches_show_on_the_right_nodes(tmp_path: Path) -> None:
    inventory = tmp_path / "life.yaml"
    up = gpucluster("sandbox", "up", "--name", LIFE, "--subnet", LIFE_SUBNET, "--nodes", "4",
                    "--gpus", "node2=4", "--gpus", "node4=0", "--driver", "node3=535.104.05",
                    "--driver", "node1=failed", "--link-rate", "node2=10mbit",
                    "--write-inventory", str(inventory), timeout=180)
    try:
        assert up.code == 0, up.stdout + up.stderr
        hosts = _run_json(inventory, "nvidia-smi --query-gpu=driver_version "
                          "--format=csv,noheader; echo rc=$?; nvidia-smi --version | tail -1")
        assert "couldn't communicate with the NVIDIA driver" in hosts["node1"]["stdout"]
        assert "rc=9" in hosts["node1"]["stdout"]
        assert hosts["node2"]["stdout"].count("590.48.01") == 4
        assert hosts["node3"]["stdout"].count("535.104.05") == 8
        assert "CUDA Version        : 12.2" in hosts["node3"]["stdout"]
        assert "command not found" in hosts["node4"]["stderr"] or \
            "not found" in hosts["node4"]["stderr"]
        qdisc = subprocess.run(["tc", "qdisc", "show", "dev", f"{LIFE}-v2"],
                               capture_output=True, text=True, check=True).stdout
        assert "tbf" in qdisc and "10Mbit" in qdisc
        status = gpucluster("sandbox", "status", "--name", LIFE, "--json")
        assert status.code == 0
        nodes = {n["name"]: n for n in status.json()["nodes"]}
        assert status.json()["gpus_simulated"] is True
        assert nodes["node2"]["gpus"].startswith("4 x h100")
        assert nodes["node4"]["gpus"] == "none"

        # Idempotent: a second identical `up` starts nothing and keeps edits made in nodes.
        edit = "198.19.1.99 peer-added-by-hand"
        gpucluster("run", "-i", str(inventory), "--hosts", "node2", f"echo '{edit}' >> /etc/hosts")
        again = gpucluster("sandbox", "up", "--name", LIFE, "--subnet", LIFE_SUBNET,
                           "--nodes", "4", "--gpus", "node2=4", "--gpus", "node4=0",
                           "--driver", "node3=535.104.05", "--driver", "node1=failed",
                           "--link-rate", "node2=10mbit", "--write-inventory", str(inventory))
        assert again.code == 0 and "started: none" in again.stdout
        kept = _run_json(inventory, "cat /etc/hosts")
        assert edit in kept["node2"]["stdout"] and edit not in kept["node1"]["stdout"]
        # Root's home is the host's seen through a layer of each node's own, gone when the
        # node stops: a node killed mid-login (pyenv's rehash lock) cannot leave the host's
        # home, or its peers', half-written.
        gpucluster("run", "-i", str(inventory), "--hosts", "node2", f"touch {HOME_MARKER}")
        assert _home_markers(inventory) == {"node1": "absent", "node2": "present",
                                            "node3": "absent", "node4": "absent"}
        assert not (Path.home() / HOME_MARKER.removeprefix("~/")).exists()
        for pid in _namespace_pids(LIFE, "node2"):  # node2 loses power
            subprocess.run(["kill", "-KILL", str(pid)], check=False)
        # Restaging: node4 gains GPUs (restarted to mount nvidia-smi), node count shrinks.
        restaged = gpucluster("sandbox", "up", "--name", LIFE, "--subnet", LIFE_SUBNET,
                              "--nodes", "3", "--write-inventory", str(inventory))
        assert restaged.code == 0, restaged.stderr
        assert "removed: node4" in restaged.stdout
        assert _home_markers(inventory)["node2"] == "absent"  # restarted: a fresh layer
        hosts = _run_json(inventory, "nvidia-smi -L | wc -l")
        assert sorted(hosts) == ["node1", "node2", "node3"]
        assert {h["stdout"].strip() for h in hosts.values()} == {"8"}
    finally:
        pids = _namespace_pids(LIFE)
        down = gpucluster("sandbox", "down", "--name", LIFE)
    assert down.code == 0, down.stderr
    assert pids, "the sandbox had no processes to check"
    _assert_nothing_left(LIFE, inventory, pids)


def _home_markers(inventory: Path) -> dict[str, str]:
    hosts = _run_json(inventory, f"test -e {HOME_MARKER} && echo present || echo absent")
    return {node: host["stdout"].strip() for node, host in hosts.items()}


def _namespace_pids(name: str, node: str = "node") -> list[int]:
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                check=True).stdout.split()
    pids: list[int] = []
    for namespace in [n for n in namespaces if n.startswith(f"{name}-{node}")]:
        output = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True,
                                text=True, check=True).stdout
        pids.extend(int(p) for p in output.split())
    return pids


def _assert_nothing_left(name: str, inventory: Path, pids: list[int]) -> None:
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                check=True).stdout
    assert f"{name}-" not in namespaces
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                           check=True).stdout
    assert f"{name}-" not in links
    assert not Path(f"/var/lib/gpucluster/sandbox/{name}").exists()
    assert not inventory.exists()
    assert [pid for pid in pids if _alive(pid)] == []
    status = gpucluster("sandbox", "status", "--name", name)
    assert status.code == 2 and "no sandbox" in status.stderr


def _alive(pid: int) -> bool:
    """Running, not merely a zombie waiting for init to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_an_edited_inventory_is_never_overwritten_or_deleted(tmp_path: Path) -> None:
    inventory = tmp_path / "mine.yaml"
    inventory.write_text("hosts: [precious]\n")
    refused = gpucluster("sandbox", "up", "--name", LIFE, "--subnet", LIFE_SUBNET,
                         "--nodes", "1", "--write-inventory", str(inventory))
    try:
        assert refused.code == 2
        assert "refusing to overwrite" in refused.stderr
        assert inventory.read_text() == "hosts: [precious]\n"
    finally:
        gpucluster("sandbox", "down", "--name", LIFE)
    assert inventory.read_text() == "hosts: [precious]\n"


def test_a_subnet_another_sandbox_uses_is_refused_before_anything_is_made(
        sandbox: Sandbox, tmp_path: Path) -> None:
    """Two bridges on one subnet: the new sandbox's inventory reached the other one's
    nodes, whose host keys were then refused."""
    inventory = tmp_path / "twin.yaml"
    wider = SUBNET.replace(".0/24", ".0/23")  # overlapping, not equal
    refused = gpucluster("sandbox", "up", "--name", "gpctwin", "--subnet", wider,
                         "--nodes", "2", "--write-inventory", str(inventory))
    assert refused.code == 2, refused.stderr
    assert refused.stderr.strip() == (
        f"gpucluster: error: --subnet {wider} overlaps {SUBNET}, which sandbox '{NAME}' "
        f"uses (fix: gpucluster sandbox down --name {NAME}, or another --subnet inside "
        f"198.18.0.0/15)")
    assert not inventory.exists() and not Path("/var/lib/gpucluster/sandbox/gpctwin").exists()
    assert "gpctwin" not in subprocess.run(["ip", "link"], capture_output=True, text=True,
                                           check=True).stdout
    assert gpucluster("run", "-i", str(sandbox.inventory), "true").code == 0  # untouched


def test_bad_sandbox_options_are_one_line_errors() -> None:
    for args, expected in [
        (["--subnet", "10.0.0.0/24"], "198.18.0.0/15"),
        (["--gpus", "node9=2"], "no node 'node9'"),
        (["--driver", "banana"], "535.104.05"),
        (["--gpu-model", "a100"], "choose one of"),
        (["--link-rate", "fast"], "100mbit"),
    ]:
        result = gpucluster("sandbox", "up", "--name", "gpcbad", "--nodes", "2", *args)
        assert result.code == 2, args
        assert expected in result.stderr
        assert "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert "gpcbad-" not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                           text=True, check=True).stdout
