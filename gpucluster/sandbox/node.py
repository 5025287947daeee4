"""One sandbox node: its files, its network namespace and link, and its sshd."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from gpucluster.errors import SandboxError
from gpucluster.sandbox import system
from gpucluster.sandbox.spec import NodeSpec, SandboxSpec
from gpucluster.templating import render

STATE_ROOT = Path("/var/lib/gpucluster/sandbox")
NVIDIA_MAJOR = 195
# Host paths each node gets its own copy of (bind targets must exist on the host).
# /tmp stays shared on purpose: venvs and interpreters there must stay visible in nodes.
BIND_TARGETS = (Path("/root/.ssh"), Path("/var/lib/containers"), Path("/run/containers"),
                Path("/srv"))
# Daemons' own directories (munge, Slurm: sockets, pid files, state, logs), one set per
# node so that each node runs its own daemons as a real server does.
SERVICE_DIRS = (Path("/run/munge"), Path("/var/lib/munge"), Path("/var/log/munge"),
                Path("/run/slurm"), Path("/var/lib/slurm"), Path("/var/log/slurm"))


@dataclass(frozen=True)
class NodePaths:
    """Where one node's private files live on the host."""

    root: Path

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def ssh_dir(self) -> Path:
        return self.root / "root-ssh"

    @property
    def home_layer(self) -> Path:
        """Where the node mounts the in-memory layer of its own over root's home."""
        return self.root / "root-layer"

    @property
    def containers(self) -> Path:
        return self.root / "containers"

    @property
    def container_run(self) -> Path:
        """The node's own /run/containers: podman's locks and mount state."""
        return self.root / "run-containers"

    @property
    def srv(self) -> Path:
        """The node's own /srv: its work directory (jobs, logs) lives there."""
        return self.root / "srv"

    def service_dir(self, target: Path) -> Path:
        """The node's own copy of one of SERVICE_DIRS (/var/lib/slurm -> var-lib-slurm)."""
        return self.root / "services" / str(target).strip("/").replace("/", "-")

    @property
    def devices(self) -> Path:
        """The node's simulated GPU device files, bound onto /dev/nvidiaN in the node."""
        return self.root / "dev"

    @property
    def home(self) -> Path:
        """The node user's own home (--user without --shared-home)."""
        return self.root / "home"

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def gpu_state(self) -> Path:
        return self.root / "gpu.json"

    @property
    def pid_file(self) -> Path:
        return self.root / "sshd.pid"

    @property
    def log(self) -> Path:
        return self.root / "sshd.log"

    @property
    def host_public_key(self) -> Path:
        return self.etc / "ssh" / "ssh_host_ed25519_key.pub"


def sandbox_dir(name: str) -> Path:
    return STATE_ROOT / name


def node_paths(spec: SandboxSpec, node: NodeSpec) -> NodePaths:
    return NodePaths(sandbox_dir(spec.name) / node.name)


def shared_home(name: str) -> Path:
    """The one home every node mounts with --shared-home, as an NFS home is."""
    return sandbox_dir(name) / "home"


def library_dir(name: str) -> Path:
    """A copy of gpucluster every node user can import: the simulated nvidia-smi's."""
    return sandbox_dir(name) / "lib"


def home_source(spec: SandboxSpec, node: NodeSpec) -> Path | None:
    """What the node mounts on the user's home, if the sandbox has a node user."""
    if spec.login is None:
        return None
    return shared_home(spec.name) if spec.login.shared_home else node_paths(spec, node).home


def netns_name(sandbox: str, node: str) -> str:
    return f"{sandbox}-{node}"


def veth_name(sandbox: str, index: int) -> str:
    return f"{sandbox}-v{index}"


def bridge_name(sandbox: str) -> str:
    return f"{sandbox}-br"


def prepare_files(spec: SandboxSpec, node: NodeSpec, controller_key: str, python: str
                  ) -> None:
    """The node's own /etc (hostname, hosts, sshd, host key), /root/.ssh, GPU state
    (its nvidia-smi run by `python`)."""
    paths = node_paths(spec, node)
    paths.root.mkdir(mode=0o711, parents=True, exist_ok=True)
    paths.root.chmod(0o711)  # any node user reaches its GPU state; nobody lists the dir
    if not paths.host_public_key.exists():
        shutil.rmtree(paths.etc, ignore_errors=True)
        shutil.copytree("/etc", paths.etc, symlinks=True)
        for old_key in (paths.etc / "ssh").glob("ssh_host_*"):
            old_key.unlink()
        system.sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{node.name}",
                  "-f", str(paths.etc / "ssh" / "ssh_host_ed25519_key"))
        # Only when the node is created: later edits (provision, staged faults) are kept.
        system.write_atomically(paths.etc / "hosts", render(
            "sandbox/hosts.j2", node=node.name, address=node.address))
        nsswitch = paths.etc / "nsswitch.conf"
        current = nsswitch.read_text() if nsswitch.is_file() else ""
        nsswitch.unlink(missing_ok=True)  # a link would lead back to this machine's file
        system.write_atomically(nsswitch, names_from_files_only(current))
        containers_conf = paths.etc / "containers" / "containers.conf"
        if not containers_conf.exists():
            containers_conf.parent.mkdir(exist_ok=True)
            system.write_atomically(containers_conf, render("sandbox/containers.conf.j2"))
    system.write_atomically(paths.etc / "hostname", node.name + "\n")
    system.write_atomically(paths.etc / "ssh" / "sshd_config", render(
        "sandbox/sshd_config.j2", node=node.name, address=node.address,
        pid_file=paths.pid_file))
    paths.ssh_dir.mkdir(mode=0o700, exist_ok=True)
    authorized = paths.ssh_dir / "authorized_keys"
    lines = authorized.read_text().splitlines() if authorized.exists() else []
    if controller_key not in lines:
        system.write_atomically(authorized, "\n".join([*lines, controller_key]) + "\n", 0o600)
    paths.home_layer.mkdir(mode=0o700, exist_ok=True)
    paths.containers.mkdir(mode=0o700, exist_ok=True)
    paths.container_run.mkdir(mode=0o700, exist_ok=True)
    paths.srv.mkdir(mode=0o755, exist_ok=True)
    paths.bin.mkdir(mode=0o755, exist_ok=True)
    for target in SERVICE_DIRS:
        _service_dir(paths.service_dir(target), target)
    write_gpu_state(spec, node, python)


def names_from_files_only(nsswitch: str) -> str:
    """`nsswitch` with host names looked up in /etc/hosts only.

    The node's copy of this machine's resolv.conf names a DNS server it cannot reach
    from its namespace, so every name /etc/hosts lacks failed with "temporary failure"
    (EAI_AGAIN) where a server's DNS answers "no such name". torch's store then warned
    for every connection, as it asks for the peer's IPv4-mapped IPv6 address (which
    /etc/hosts cannot list). Files only: a network whose DNS knows none of its nodes."""
    lines = [line for line in nsswitch.splitlines() if not line.startswith("hosts:")]
    return "\n".join([*lines, "# gpucluster sandbox: the nodes have no DNS", "hosts: files"]) + "\n"


def _service_dir(own: Path, target: Path) -> None:
    """An empty directory owned as the host's `target` is (munge:munge...)."""
    if own.exists():
        return
    own.mkdir(parents=True)
    found = target.stat()
    os.chown(own, found.st_uid, found.st_gid)
    own.chmod(found.st_mode & 0o7777)


def simulates_gpu(node: NodeSpec) -> bool:
    """A node with 0 GPUs has no nvidia-smi at all, like a CPU server."""
    return node.gpu_count > 0 or node.driver_fault is not None


def write_gpu_state(spec: SandboxSpec, node: NodeSpec, python: str) -> None:
    """The simulated GPUs' state, and the nvidia-smi that replays it: readable and
    runnable by every user of the node, as a real nvidia-smi is."""
    paths = node_paths(spec, node)
    state = {"model": node.gpu_model, "count": node.gpu_count, "driver": node.driver,
             "fault": node.driver_fault, "slowdown": node.clock_slowdown, "node": node.name}
    system.write_atomically(paths.gpu_state, json.dumps(state) + "\n")
    _device_files(paths.devices, node.gpu_count if simulates_gpu(node) else 0)
    wrapper = paths.bin / "nvidia-smi"
    if simulates_gpu(node):
        system.write_atomically(wrapper, render("sandbox/nvidia-smi.j2", node=node.name,
                                                python=python, state=paths.gpu_state,
                                                library=library_dir(spec.name)), 0o755)
    else:
        wrapper.unlink(missing_ok=True)


def device_target(index: int) -> Path:
    return Path(f"/dev/nvidia{index}")


def _device_files(directory: Path, count: int) -> None:
    """Character devices nvidia0..count-1 with NVIDIA's major number (195), as a real
    node has: Slurm's GRES needs device files to count GPUs by. Nothing can open them
    without the driver; they are there to be found."""
    directory.mkdir(mode=0o755, exist_ok=True)
    for extra in directory.glob("nvidia*"):
        if int(extra.name.removeprefix("nvidia") or -1) >= count:
            extra.unlink()
    for index in range(count):
        device = directory / f"nvidia{index}"
        if not device.exists():
            os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(NVIDIA_MAJOR, index))


def device_files(spec: SandboxSpec, node: NodeSpec) -> list[tuple[Path, Path]]:
    """(the node's own device file, where it appears in the node) pairs."""
    directory = node_paths(spec, node).devices
    count = node.gpu_count if simulates_gpu(node) else 0
    return [(directory / f"nvidia{i}", device_target(i)) for i in range(count)]


def ensure_bridge(spec: SandboxSpec) -> None:
    bridge = bridge_name(spec.name)
    if not system.link_exists(bridge):
        system.sh("ip", "link", "add", bridge, "type", "bridge")
        system.sh("ip", "addr", "add", f"{spec.bridge_address}/{spec.prefix_length}",
                  "dev", bridge)
    system.sh("ip", "link", "set", bridge, "up")
    # The controller's own link into the sandbox: what the host sends onto the bridge.
    system.shape(bridge, spec.controller_rate, spec.latency)


def ensure_network(spec: SandboxSpec, node: NodeSpec) -> None:
    """Namespace, veth pair (eth0 inside), address, bridge port, link shaping."""
    namespace = netns_name(spec.name, node.name)
    veth = veth_name(spec.name, node.index)
    if namespace not in system.netns_list():
        system.sh("ip", "netns", "add", namespace)
    if not system.link_exists(veth):
        system.sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0",
                  "netns", namespace)
        system.sh("ip", "-n", namespace, "addr", "add",
                  f"{node.address}/{spec.prefix_length}", "dev", "eth0")
    system.sh("ip", "link", "set", veth, "master", bridge_name(spec.name), "up")
    system.sh("ip", "-n", namespace, "link", "set", "lo", "up")
    system.sh("ip", "-n", namespace, "link", "set", "eth0", "up")
    system.set_mtu(namespace, "eth0", node.mtu)
    system.shape(veth, node.link_rate, spec.latency)  # into the node
    system.shape("eth0", node.link_rate, spec.latency, namespace=namespace)  # out of it


def sshd_pid(spec: SandboxSpec, node: NodeSpec) -> int | None:
    """The node's sshd, if it runs (its pid file names a live sshd in the namespace)."""
    paths = node_paths(spec, node)
    try:
        pid = int(paths.pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    if pid not in system.netns_pids(netns_name(spec.name, node.name)):
        return None
    return pid


def start(spec: SandboxSpec, node: NodeSpec) -> None:
    """Start the node's sshd in fresh mount + UTS namespaces inside its netns."""
    paths = node_paths(spec, node)
    paths.pid_file.unlink(missing_ok=True)
    home = home_source(spec, node)
    services = [(paths.service_dir(target), target) for target in SERVICE_DIRS]
    services += device_files(spec, node)
    script = render("sandbox/node_init.sh.j2", node=node.name, paths=paths, services=services,
                    simulate_gpu=simulates_gpu(node), cgroup_mounts=cgroup_mounts(),
                    home=home, home_target=spec.login and f"/home/{spec.login.user}")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    with paths.log.open("ab") as log:
        subprocess.Popen(
            ["ip", "netns", "exec", netns_name(spec.name, node.name),
             "unshare", "--mount", "--uts", "--propagation", "private", "/bin/sh", "-c", script],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)


@dataclass(frozen=True)
class Mount:
    source: str
    path: str
    fstype: str
    options: str


def cgroup_mounts(mounts: Path = Path("/proc/self/mounts")) -> list[Mount]:
    """The host's cgroup hierarchies (and the tmpfs holding them), in mount order.
    `ip netns exec` gives the node a fresh /sys without them, and container runtimes
    need them: the node mounts the same hierarchies again."""
    found = []
    for line in mounts.read_text().splitlines():
        source, path, fstype, options, *_ = line.split()
        if path == "/sys/fs/cgroup" or (path.startswith("/sys/fs/cgroup/")
                                        and fstype in ("cgroup", "cgroup2")):
            found.append(Mount(source, path, fstype, options))
    return found


def wait_until_listening(spec: SandboxSpec, node: NodeSpec, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sshd_pid(spec, node) is not None and port_open(node.address, 22, 0.5):
            return
        time.sleep(0.05)
    log = node_paths(spec, node).log
    tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
    raise SandboxError(f"{node.name}: sshd did not start within {timeout:g}s"
                       + (f": {' | '.join(tail)}" if tail else ""))


def port_open(address: str, port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False
