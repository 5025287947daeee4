"""One sandbox for the whole test session (integration and fault tests): 4 real sshd
nodes in namespaces. tests/conftest.py makes the `sandbox` fixture available everywhere.

It must start: a missing tool or missing root is a failure, never a skip (CI installs
everything via .ci/run).
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.cli import gpucluster

NAME = "gpctest"
SUBNET = "198.19.0.0/24"
NODES = 4


@dataclass
class Sandbox:
    name: str
    inventory: Path
    nodes: list[str]
    addresses: dict[str, str]
    data: dict  # the inventory as YAML

    def sshd_pid(self, node: str) -> int:
        state = Path(f"/var/lib/gpucluster/sandbox/{self.name}/{node}/sshd.pid")
        return int(state.read_text())

    def node_argv(self, node: str, argv: list[str]) -> list[str]:
        """argv that runs inside the node's namespaces, bypassing SSH."""
        return ["nsenter", "-t", str(self.sshd_pid(node)), "-n", "-m", "-u", "--", *argv]

    def node_exec(self, node: str, command: str, check: bool = True
                  ) -> subprocess.CompletedProcess[str]:
        """Run a shell command inside the node's namespaces, bypassing SSH."""
        return subprocess.run(self.node_argv(node, ["/bin/sh", "-c", command]),
                              capture_output=True, text=True, timeout=30, check=check)

    @contextmanager
    def slow_login(self, node: str, seconds: float, extra: str = "") -> Iterator[None]:
        """Every login on `node` takes `seconds` longer inside the block: a sleep in its
        ~/.bashrc, which is the node's own (its layer over root's home), restored after."""
        self.node_exec(node, "if [ -e ~/.bashrc ]; then cp -p ~/.bashrc ~/.bashrc.gpc-test; "
                             f"fi; echo '{extra}sleep {seconds:g}  # gpc-test slow login' "
                             ">> ~/.bashrc")
        try:
            yield
        finally:
            self.node_exec(node, "if [ -e ~/.bashrc.gpc-test ]; then mv -f ~/.bashrc.gpc-test "
                                 "~/.bashrc; else rm -f ~/.bashrc; fi")

    def restage(self, *flags: str) -> None:
        """`sandbox up` again on this live sandbox with `flags`, a fault staged (none: as
        it was made); its inventory is rewritten as it was."""
        subnet = ipaddress.ip_network(f"{next(iter(self.addresses.values()))}/24",
                                      strict=False)  # a sandbox's subnet is a /24
        up = gpucluster("sandbox", "up", "--name", self.name, "--subnet", str(subnet),
                        "--nodes", str(len(self.nodes)), *flags, "--write-inventory",
                        str(self.inventory), timeout=120)
        assert up.code == 0, up.stdout + up.stderr

    def write_inventory(self, path: Path, **changes: object) -> Path:
        """A copy of the sandbox inventory with some top-level sections replaced."""
        data = {**self.data, **changes}
        path.write_text(yaml.safe_dump(data))
        return path


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    inventory = tmp_path_factory.mktemp("sandbox") / "sandbox.yaml"
    gpucluster("sandbox", "down", "--name", NAME)  # leftovers of an interrupted run
    up = gpucluster("sandbox", "up", "--name", NAME, "--subnet", SUBNET, "--nodes",
                    str(NODES), "--write-inventory", str(inventory), timeout=180)
    assert up.code == 0, f"sandbox did not start:\n{up.stdout}\n{up.stderr}"
    data = yaml.safe_load(inventory.read_text())
    addresses = {h["name"]: h["address"] for h in data["hosts"]}
    try:
        yield Sandbox(NAME, inventory, list(addresses), addresses, data)
    finally:
        down = gpucluster("sandbox", "down", "--name", NAME, timeout=120)
        assert down.code == 0, down.stderr


TRAIN = Path(__file__).parents[1] / "examples" / "train.py"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A work dir holding examples/train.py, for launch tests."""
    directory = tmp_path / "project"
    directory.mkdir()
    shutil.copy(TRAIN, directory / "train.py")
    return directory


def start_sandbox(inventory: Path, name: str, subnet: str, nodes: int, *flags: str,
                  provision: str | None = None) -> Sandbox:
    """A sandbox of a test module's own (for tests that change nodes in ways the shared
    one must not see), fresh, optionally provisioned with `provision`'s steps."""
    gpucluster("sandbox", "down", "--name", name)  # leftovers of an interrupted run
    up = gpucluster("sandbox", "up", "--name", name, "--subnet", subnet, "--nodes",
                    str(nodes), *flags, "--write-inventory", str(inventory), timeout=600)
    assert up.code == 0, up.stderr
    data = yaml.safe_load(inventory.read_text())
    sandbox = Sandbox(name, inventory, [h["name"] for h in data["hosts"]],
                      {h["name"]: h["address"] for h in data["hosts"]}, data)
    if provision:
        try:
            done = gpucluster("provision", "-i", str(inventory), "--only", provision,
                              timeout=180)
            assert done.code == 0, done.stdout + done.stderr
        except BaseException:  # the module's teardown never runs: leave no namespaces
            gpucluster("sandbox", "down", "--name", name)
            raise
    return sandbox


@contextmanager
def busybox_image(root: Path, reference: str,
                  files: dict[str, bytes] | None = None) -> Iterator[str]:
    """A real podman image in the controller's storage, made from a static busybox (with
    sh, sleep and hostname) plus `files` (executable); removed afterwards."""
    (root / "bin").mkdir()
    shutil.copy("/bin/busybox", root / "bin" / "busybox")
    for applet in ("sh", "sleep", "hostname"):
        (root / "bin" / applet).symlink_to("busybox")
    for name, data in (files or {}).items():
        (root / name).write_bytes(data)
        (root / name).chmod(0o755)
    archive = root.parent / f"{root.name}.tar"
    subprocess.run(["tar", "-C", str(root), "-cf", str(archive), "."], check=True)
    subprocess.run(["podman", "import", "-q", str(archive), reference], check=True,
                   capture_output=True)
    try:
        yield reference
    finally:
        subprocess.run(["podman", "rmi", "-f", reference], check=False, capture_output=True)
