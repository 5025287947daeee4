from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpucluster.errors import SandboxError
from gpucluster.sandbox import spec, system


def test_overrides_apply_per_node_on_top_of_a_default() -> None:
    built = spec.build("gpcsb", "198.18.0.0/24", 4, "h100", ["2", "node3=0"],
                       ["node2=535.104.05", "node4=failed"], ["1gbit", "node4=100mbit"], "50ms")
    nodes = {n.name: n for n in built.nodes}
    assert [n.address for n in built.nodes] == ["198.18.0.11", "198.18.0.12", "198.18.0.13",
                                                "198.18.0.14"]
    assert (nodes["node1"].gpu_count, nodes["node3"].gpu_count) == (2, 0)
    assert nodes["node2"].driver == "535.104.05" and nodes["node1"].driver is None
    assert nodes["node4"].driver_fault == "failed" and nodes["node4"].driver is None
    assert nodes["node4"].link_rate == "100mbit" and nodes["node1"].link_rate == "1gbit"
    assert built.controller_rate == "1gbit"
    assert built.bridge_address == "198.18.0.1"
    slowed = spec.build("gpcsb", "198.18.0.0/24", 2, "h100", [], [], [], "50ms",
                        clock_slowdowns=["node2=hw_thermal"])
    assert [n.clock_slowdown for n in slowed.nodes] == [None, "hw_thermal"]
    jumbo = spec.build("gpcsb", "198.18.0.0/24", 3, "h100", [], [], [], "50ms",
                       mtus=["node2=9000", "node3=9000"])
    assert [n.mtu for n in jumbo.nodes] == [None, 9000, 9000]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"name": "Bad-Name"}, "--name"),
    ({"nodes": 0}, "--nodes 0"),
    ({"subnet": "192.168.1.0/24"}, "198.18.0.0/15"),
    ({"subnet": "198.18.0.0/28"}, "/24 or larger"),
    ({"gpus": ["lots"]}, "--gpus"),
    ({"gpus": ["²"]}, "--gpus '²': use a GPU count"),  # a digit to isdigit(), not to int()
    ({"drivers": ["node2=new"]}, "535.104.05"),
    ({"link_rates": ["node9=1gbit"]}, "no node 'node9'"),
    ({"latency": "soon"}, "--latency"),
    ({"gpu_model": "a100"}, "choose one of"),
    ({"clock_slowdowns": ["node1=hot"]}, "--clock-slowdown 'hot': use one of hw_slowdown"),
    ({"mtus": ["node2=65536"]}, "--mtu '65536': use an MTU from 1280 to 9216"),
    ({"mtus": ["jumbo"]}, "--mtu 'jumbo'"),
])
def test_bad_options(kwargs: dict, message: str) -> None:
    arguments = {"name": "gpcsb", "subnet": "198.18.0.0/24", "nodes": 3, "gpu_model": "h100",
                 "gpus": [], "drivers": [], "link_rates": [], "latency": "50ms", **kwargs}
    with pytest.raises(SandboxError, match=message.replace("[", r"\[")):
        spec.build(**arguments)


def test_token_bucket_burst_covers_ten_milliseconds() -> None:
    assert system.tbf_burst("1gbit") == str(1_250_000)
    assert system.tbf_burst("10mbit") == str(64 * 1024)


def test_missing_root_and_tools_is_one_message_with_the_install_command(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(system.shutil, "which", lambda tool: None if tool == "tc" else tool)
    monkeypatch.setattr(system, "SSHD", system.Path("/nonexistent/sshd"))
    with pytest.raises(SandboxError) as caught:
        system.require_root_and_tools()
    message = str(caught.value)
    assert "must run as root" in message
    assert "apt-get install -y iproute2 openssh-server" in message
    assert "\n" not in message


def test_a_mount_point_another_sandbox_still_uses_is_handed_over_not_removed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from gpucluster.sandbox import cluster, node

    monkeypatch.setattr(node, "STATE_ROOT", tmp_path)
    for name, targets in (("first", ["/root/.ssh"]), ("second", [])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "state.json").write_text(json.dumps(
            {"spec": {}, "inventory": str(tmp_path / f"{name}.yaml"),
             "inventory_sha256": "", "created_targets": targets}))
    first = json.loads((tmp_path / "first" / "state.json").read_text())
    assert cluster._hand_over_targets("first", first) is True
    second = json.loads((tmp_path / "second" / "state.json").read_text())
    assert second["created_targets"] == ["/root/.ssh"]  # removed when the last one goes
    assert cluster._remove_files(first, targets_handed_over=True) == []
    (tmp_path / "second").rename(tmp_path / "gone")
    (tmp_path / "gone" / "state.json").unlink()
    assert cluster._hand_over_targets("first", first) is False  # the last one: removes


@pytest.mark.parametrize(("user", "sudo", "shared", "message"), [
    (None, "nopasswd", True, "add --user NAME"),
    (None, "none", False, "add --user NAME"),
    ("root", "nopasswd", False, "not root"),
    ("Bad User", "nopasswd", False, "use a login name"),
    ("gcuser", "always", False, "use one of nopasswd, password, none"),
])
def test_bad_login_options(user: str | None, sudo: str, shared: bool, message: str) -> None:
    with pytest.raises(SandboxError, match=re.escape(message)):
        spec.build_login(user, sudo, shared)


def test_a_login_travels_in_the_spec_and_names_the_user() -> None:
    login = spec.build_login("gcuser", "password", True)
    assert login == spec.NodeLogin("gcuser", "password", True)
    built = spec.build("gcsb", spec.DEFAULT_SUBNET, 2, "h100", [], [], [], "50ms", login)
    assert built.user == "gcuser" and built.login == login
    assert spec.build("gcsb", spec.DEFAULT_SUBNET, 2, "h100", [], [], [], "50ms").user == "root"


def test_node_python_takes_the_node_extras_pins_from_the_package_metadata() -> None:
    from gpucluster.sandbox import node_python

    wanted = node_python.requirements()
    assert "torch==2.13.0" in wanted  # the CPU wheel's pin, not a range: no CUDA download
    assert not any(name.startswith(("pytest", "mypy", "ansible")) for name in wanted)


def test_usable_by_everyone_needs_every_directory_on_the_way() -> None:
    import shutil
    import tempfile

    from gpucluster.sandbox import node_python

    base = Path(tempfile.mkdtemp(dir="/var/tmp"))  # pytest's own tmp is private to root
    try:
        base.chmod(0o755)
        closed = base / "closed"
        closed.mkdir(mode=0o700)
        tool = closed / "python"
        tool.write_text("#!/bin/sh\n")
        tool.chmod(0o755)
        assert not node_python.usable_by_everyone(tool)  # as a pyenv build under /root is
        closed.chmod(0o755)
        assert node_python.usable_by_everyone(tool)
        assert not node_python.usable_by_everyone(closed / "missing")
    finally:
        shutil.rmtree(base)


def test_status_of_a_sandbox_not_up_names_those_that_are(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`sandbox status` looks for the default name: a user whose sandbox has another
    name was told none is up."""
    from gpucluster.sandbox import node, state

    monkeypatch.setattr(node, "STATE_ROOT", tmp_path)
    with pytest.raises(SandboxError, match=r"^no sandbox 'gpcsb' is up \(start one with "):
        state.load_spec("gpcsb")
    for name in ("gpcnu", "lab"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "state.json").write_text(json.dumps({"spec": {"name": name}}))
    (tmp_path / "gone").mkdir()  # a directory without state: not up
    with pytest.raises(SandboxError) as refused:
        state.load_spec("gpcsb")
    assert str(refused.value) == ("no sandbox 'gpcsb' is up; up: gpcnu, lab (fix: --name "
                                  "gpcnu)")
