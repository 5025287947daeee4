"""Bring a sandbox up (idempotently), report its status, and take it down completely."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpucluster.errors import SandboxError
from gpucluster.sandbox import captures, login, node, node_python, system
from gpucluster.sandbox.spec import SANDBOX_RANGE, NodeSpec, SandboxSpec
from gpucluster.sandbox.state import load_spec, read_state, state_file
from gpucluster.templating import render


@dataclass(frozen=True)
class NodeStatus:
    """What `sandbox status` reports per node."""

    name: str
    address: str
    namespace: bool
    sshd_pid: int | None
    ssh_port_open: bool
    gpus: str
    link_rate: str | None
    mtu: int | None = None  # eth0's, where --mtu set one

    @property
    def up(self) -> bool:
        return self.namespace and self.sshd_pid is not None and self.ssh_port_open


@dataclass(frozen=True)
class UpResult:
    spec: SandboxSpec
    inventory: Path
    started: tuple[str, ...]  # nodes whose sshd was (re)started now
    removed: tuple[str, ...]  # nodes beyond --nodes taken down


def _controller_key(spec: SandboxSpec) -> tuple[Path, str]:
    """The key the controller logs in with, made once per sandbox."""
    key = node.sandbox_dir(spec.name) / "id_ed25519"
    if not key.exists():
        system.sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C",
                  f"gpucluster-sandbox-{spec.name}", "-f", str(key))
    return key, Path(f"{key}.pub").read_text().strip()


def up(spec: SandboxSpec, inventory_path: Path,
       say: Callable[[str], None] = lambda _: None) -> UpResult:
    """Create what is missing, restart what is down, leave what runs; write the inventory.
    `say` hears about slow steps (making the node users' python)."""
    system.require_root_and_tools()
    previous = read_state(spec.name)
    created = set(previous.get("created_targets", [])) if previous else set()
    if previous is not None and "spec" not in previous:
        previous = None  # an `up` that failed early: only the targets it made count
    if previous is not None and previous["spec"]["subnet"] != spec.subnet:
        subnet = previous['spec']['subnet']
        raise SandboxError(f"sandbox {spec.name!r} is up on {subnet}: to repair or restage it, "
                           f"add --subnet {subnet}; to move it, run "
                           f"`gpucluster sandbox down --name {spec.name}` first")
    _check_subnet_free(spec)
    _check_inventory_writable(inventory_path, previous)
    sandbox = node.sandbox_dir(spec.name)
    sandbox.mkdir(mode=0o711, parents=True, exist_ok=True)
    sandbox.chmod(0o711)  # node users reach their GPU state and library; nobody lists it
    python = str(node_python.ensure(say)) if spec.login else _python()
    _copy_library(spec.name)
    _create_bind_targets(spec, previous, created)
    key, public_key = _controller_key(spec)
    removed = _remove_extra_nodes(spec, previous)
    node.ensure_bridge(spec)
    uid = _prepare_login(spec, previous, public_key)
    started = []
    old_nodes = {n["name"]: n for n in previous["spec"]["nodes"]} if previous else {}
    login_changed = previous is not None and previous["spec"].get("login") != (
        asdict(spec.login) if spec.login else None)
    for each in spec.nodes:
        node.prepare_files(spec, each, public_key, python)
        if spec.login and uid is not None:
            login.ensure_account(node.node_paths(spec, each).root, spec.login, uid,
                                 sandbox / "sudo-password")
        node.ensure_network(spec, each)
        old = old_nodes.get(each.name)
        gpu_presence_changed = old is not None and node.simulates_gpu(NodeSpec(**old)) != \
            node.simulates_gpu(each)
        # nvidia-smi and the user's home are mounted at start: restart to change them
        if gpu_presence_changed or (old is not None and login_changed):
            system.kill_namespace(node.netns_name(spec.name, each.name))
        if node.sshd_pid(spec, each) is None:
            node.start(spec, each)
            started.append(each.name)
    for each in spec.nodes:
        if each.name in started:
            node.wait_until_listening(spec, each)
    known_hosts = sandbox / "known_hosts"
    system.write_atomically(known_hosts, "".join(
        f"{n.name},{n.address} {node.node_paths(spec, n).host_public_key.read_text().strip()}\n"
        for n in spec.nodes), 0o600)
    inventory_text = render(
        "sandbox/inventory.yaml.j2", name=spec.name, model=spec.base_model,
        known_hosts=str(known_hosts), python=python, login=spec.login,
        torchrun=str(Path(python).parent / "torchrun"), identity_file=str(key),
        gpus=spec.base_gpus, gpu_model=captures.load(spec.base_model).query_gpu_fields()["name"],
        nodes=spec.nodes)
    inventory_path.parent.mkdir(parents=True, exist_ok=True)
    system.write_atomically(inventory_path, inventory_text)
    state = {"spec": asdict(spec), "inventory": str(inventory_path.absolute()),
             "inventory_sha256": _sha256(inventory_text.encode()),
             "created_targets": sorted(created), "login_uid": uid}
    system.write_atomically(state_file(spec.name), json.dumps(state, indent=2) + "\n", 0o600)
    return UpResult(spec, inventory_path, tuple(started), removed)


def _create_bind_targets(spec: SandboxSpec, previous: dict[str, Any] | None,
                         created: set[str]) -> None:
    """The host paths nodes bind their own copies onto, made where missing and recorded
    at once, so that `down` removes them even if this `up` fails further on."""
    targets = [*node.BIND_TARGETS, *node.SERVICE_DIRS]
    if spec.login:
        targets.append(login.home_path(spec.login))
    devices = [node.device_target(i) for i in range(max(n.gpu_count for n in spec.nodes))]
    for target in [*targets, *devices]:
        if target.exists():
            continue
        if target in devices:  # an empty file, only to bind a node's device onto
            target.touch(mode=0o600)
        else:
            target.mkdir(mode=0o700 if target in node.BIND_TARGETS else 0o755, parents=True)
        created.add(str(target))
        system.write_atomically(state_file(spec.name), json.dumps(
            {**(previous or {}), "created_targets": sorted(created)}, indent=2) + "\n",
            0o600)


def _prepare_login(spec: SandboxSpec, previous: dict[str, Any] | None, public_key: str
                   ) -> int | None:
    """The node user's uid and home(s), with the controller's key; None without one."""
    if spec.login is None:
        return None
    uid = login.choose_uid(spec.login, previous.get("login_uid") if previous else None)
    homes = [node.shared_home(spec.name)] if spec.login.shared_home else [
        node.node_paths(spec, each).home for each in spec.nodes]
    for home in homes:
        login.ensure_home(home, uid, public_key)
    return uid


def _copy_library(name: str) -> None:
    """gpucluster's own package where every node user can import it (the simulated
    nvidia-smi runs from it), replaced whole on each `up`."""
    source = Path(__file__).resolve().parents[1]
    target = node.library_dir(name)
    fresh = target.with_name("lib.new")
    shutil.rmtree(fresh, ignore_errors=True)
    shutil.copytree(source, fresh / "gpucluster",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for path in [fresh, *fresh.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    shutil.rmtree(target, ignore_errors=True)
    fresh.rename(target)


def _python() -> str:
    import sys

    return sys.executable


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _check_subnet_free(spec: SandboxSpec) -> None:
    """Two bridges on one subnet route the controller to whichever the kernel picks: the
    new sandbox's inventory then reaches the other one's nodes (their host keys refused)."""
    network = ipaddress.ip_network(spec.subnet)
    ours = node.bridge_name(spec.name)
    owners = {node.bridge_name(path.name): path.name for path in node.STATE_ROOT.iterdir()
              if path.is_dir()} if node.STATE_ROOT.is_dir() else {}
    for link, address in system.host_networks():
        if link == ours or not address.network.overlaps(network):
            continue
        user = f"sandbox {owners[link]!r}" if link in owners else f"this machine's {link}"
        free = (f"gpucluster sandbox down --name {owners[link]}, or another --subnet"
                if link in owners else "another --subnet")
        raise SandboxError(f"--subnet {spec.subnet} overlaps {address.network}, which "
                           f"{user} uses (fix: {free} inside {SANDBOX_RANGE})")


def _check_inventory_writable(path: Path, previous: dict[str, Any] | None) -> None:
    """Overwrite only an inventory this sandbox wrote and nobody changed since."""
    if not path.exists():
        return
    ours = previous is not None and previous.get("inventory") == str(path.absolute()) and \
        previous.get("inventory_sha256") == _sha256(path.read_bytes())
    if not ours:
        raise SandboxError(f"{path} exists and was not written by this sandbox (or was "
                           f"edited); refusing to overwrite it: pass --write-inventory OTHER")


def _remove_extra_nodes(spec: SandboxSpec, previous: dict[str, Any] | None) -> tuple[str, ...]:
    if previous is None:
        return ()
    wanted = {n.name for n in spec.nodes}
    removed = []
    for old in previous["spec"]["nodes"]:
        if old["name"] not in wanted:
            _remove_node(spec.name, NodeSpec(**old))
            removed.append(old["name"])
    return tuple(removed)


def _remove_node(sandbox: str, each: NodeSpec) -> None:
    namespace = node.netns_name(sandbox, each.name)
    if namespace in system.netns_list():
        system.kill_namespace(namespace)
        system.sh("ip", "netns", "del", namespace)
    veth = node.veth_name(sandbox, each.index)
    if system.link_exists(veth):
        system.sh("ip", "link", "del", veth)
    shutil.rmtree(node.sandbox_dir(sandbox) / each.name, ignore_errors=True)


def down(name: str) -> list[str]:
    """Remove everything the sandbox made; also cleans up after a crashed `up`."""
    system.require_root_and_tools()
    removed: list[str] = []
    state = read_state(name)
    prefix = f"{name}-node"
    for namespace in system.netns_list():
        if namespace.startswith(prefix) and namespace[len(prefix):].isdigit():
            system.kill_namespace(namespace)
            system.sh("ip", "netns", "del", namespace)
            removed.append(f"namespace {namespace}")
    links = system.sh("ip", "-o", "link", "show", check=False).stdout
    for line in links.splitlines():
        link = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if link.startswith(f"{name}-v") or link == node.bridge_name(name):
            system.sh("ip", "link", "del", link, check=False)
            removed.append(f"link {link}")
    if state is not None:
        removed.extend(_remove_files(state, _hand_over_targets(name, state)))
    sandbox = node.sandbox_dir(name)
    if sandbox.exists():
        shutil.rmtree(sandbox)
        removed.append(f"directory {sandbox}")
    for parent in (node.STATE_ROOT, node.STATE_ROOT.parent):
        if parent.exists() and not any(parent.iterdir()):
            parent.rmdir()
    return removed


def _hand_over_targets(name: str, state: dict[str, Any]) -> bool:
    """Mount points this sandbox created (/root/.ssh...) that another sandbox's nodes
    still mount: removing one on the host would unmount it inside those nodes (Linux
    detaches a mount whose mount point is removed in another namespace), locking
    everyone out of them. The other sandbox takes them over instead; True if one did."""
    targets = state.get("created_targets", [])
    if not targets or not node.STATE_ROOT.is_dir():
        return False
    for other in sorted(node.STATE_ROOT.iterdir()):
        other_state = read_state(other.name) if other.name != name else None
        if other_state is not None:
            other_state["created_targets"] = sorted(
                {*other_state.get("created_targets", []), *targets})
            system.write_atomically(state_file(other.name),
                                    json.dumps(other_state, indent=2) + "\n", 0o600)
            return True
    return False


def _remove_files(state: dict[str, Any], targets_handed_over: bool) -> list[str]:
    removed = []
    inventory = Path(state.get("inventory", "/nonexistent"))  # none: an `up` that failed early
    if inventory.exists() and _sha256(inventory.read_bytes()) == state.get("inventory_sha256"):
        inventory.unlink()
        removed.append(f"inventory {inventory}")
    for target in map(Path, [] if targets_handed_over else state.get("created_targets", [])):
        if target.is_dir() and not any(target.iterdir()):
            target.rmdir()
            # It reads like the user's own ~/.ssh was deleted unless it says what it was.
            removed.append(f"empty mount point {target} (the sandbox created it for the "
                           f"nodes; nothing of yours was in it)")
        elif target.is_file() and target.stat().st_size == 0:
            target.unlink()
            removed.append(f"empty mount point {target} (for the nodes' simulated GPU "
                           f"device files)")
    return removed


def status(name: str) -> tuple[SandboxSpec, list[NodeStatus]]:
    spec = load_spec(name)
    namespaces = set(system.netns_list())
    rows = []
    for each in spec.nodes:
        pid = node.sshd_pid(spec, each)
        if each.driver_fault is not None:
            gpus = f"driver {each.driver_fault} (simulated)"
        elif each.gpu_count == 0:
            gpus = "none"
        else:
            driver = each.driver or captures.load(each.gpu_model).driver
            gpus = f"{each.gpu_count} x {each.gpu_model}, driver {driver} (simulated)"
            if each.clock_slowdown:
                gpus += f", clocks held down: {each.clock_slowdown}"
        rows.append(NodeStatus(
            name=each.name, address=each.address,
            namespace=node.netns_name(name, each.name) in namespaces, sshd_pid=pid,
            ssh_port_open=pid is not None and node.port_open(each.address, 22, 1.0),
            gpus=gpus, link_rate=each.link_rate, mtu=each.mtu))
    return spec, rows
