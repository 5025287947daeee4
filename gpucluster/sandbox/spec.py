"""What a sandbox should look like: node count, addresses, simulated GPUs, link shaping.

Per-node overrides are written `node3=535.104.05`; a value without `node=` applies to
every node.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from gpucluster import clock_events
from gpucluster.errors import SandboxError
from gpucluster.numerals import is_number
from gpucluster.sandbox import captures

DEFAULT_NAME = "gpcsb"
DEFAULT_SUBNET = "198.18.0.0/24"
SANDBOX_RANGE = ipaddress.IPv4Network("198.18.0.0/15")  # reserved for benchmarking (RFC 2544)
MAX_NODES = 200
FIRST_NODE_HOST = 11  # node1 = .11, so the bridge (.1) and nodes never collide
_NAME = re.compile(r"[a-z][a-z0-9]{0,7}")  # short: interface names max 15 chars
_RATE = re.compile(r"\d+(\.\d+)?(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps)")
_LATENCY = re.compile(r"\d+(\.\d+)?(us|ms|s)")
DRIVER_FAULTS = ("failed", "hung")
MTU_RANGE = (1280, 9216)  # IPv6's minimum to the largest jumbo frame switches carry
SUDO_MODES = ("nopasswd", "password", "none")
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,30}")
_DRIVER = re.compile(r"\d+\.\d+(\.\d+)?")


@dataclass(frozen=True)
class NodeSpec:
    """One node as it should be."""

    name: str
    index: int
    address: str
    gpu_count: int
    gpu_model: str
    driver: str | None  # None: the capture's own driver
    driver_fault: str | None  # "failed" (nvidia-smi cannot reach it), "hung", or None
    link_rate: str | None
    clock_slowdown: str | None = None  # a clock event reason on every GPU, e.g. hw_thermal
    mtu: int | None = None  # eth0's; None: 1500, what the bridge (the switch) carries


@dataclass(frozen=True)
class NodeLogin:
    """An ordinary user the nodes are reached as, instead of root: how cloud images
    (the `ubuntu` user) and most shared servers are."""

    user: str
    sudo: str  # nopasswd | password | none
    shared_home: bool  # one home for all nodes, as an NFS home is


def build_login(user: str | None, sudo: str, shared_home: bool) -> NodeLogin | None:
    if user is None:
        if shared_home or sudo != "nopasswd":
            raise SandboxError("--sudo and --shared-home are about the node user: add "
                               "--user NAME")
        return None
    if not _USER.fullmatch(user) or user == "root":
        raise SandboxError(f"--user {user!r}: use a login name like gcuser (lowercase "
                           f"letters, digits, - and _; not root, which is the default)")
    if sudo not in SUDO_MODES:
        raise SandboxError(f"--sudo {sudo!r}: use one of {', '.join(SUDO_MODES)}")
    return NodeLogin(user, sudo, shared_home)


@dataclass(frozen=True)
class SandboxSpec:
    """The whole sandbox as it should be."""

    name: str
    subnet: str
    nodes: tuple[NodeSpec, ...]
    latency: str = "50ms"
    controller_rate: str | None = None
    base_gpus: int = 8
    base_model: str = captures.DEFAULT_MODEL
    login: NodeLogin | None = None  # None: root logs in, as before

    @property
    def user(self) -> str:
        return self.login.user if self.login else "root"

    @property
    def bridge_address(self) -> str:
        return str(next(ipaddress.ip_network(self.subnet).hosts()))

    @property
    def prefix_length(self) -> int:
        return ipaddress.ip_network(self.subnet).prefixlen


def parse_overrides(values: list[str], option: str, node_names: list[str]) -> tuple[
        str | None, dict[str, str]]:
    """['100mbit', 'node4=10mbit'] -> ('100mbit', {'node4': '10mbit'})."""
    everyone: str | None = None
    per_node: dict[str, str] = {}
    for value in values:
        name, sep, setting = value.partition("=")
        if not sep:
            everyone = value
            continue
        if name not in node_names:
            raise SandboxError(f"{option} {value}: no node {name!r} "
                               f"(nodes are node1..node{len(node_names)})")
        per_node[name] = setting
    return everyone, per_node


def build(name: str, subnet: str, nodes: int, gpu_model: str, gpus: list[str],
          drivers: list[str], link_rates: list[str], latency: str,
          login: NodeLogin | None = None, clock_slowdowns: list[str] | None = None,
          mtus: list[str] | None = None) -> SandboxSpec:
    """Validate the options of `sandbox up` into a spec; SandboxError says what is wrong."""
    if not _NAME.fullmatch(name):
        raise SandboxError(f"--name {name!r}: use 1-8 lowercase letters/digits, starting "
                           f"with a letter")
    if not 1 <= nodes <= MAX_NODES:
        raise SandboxError(f"--nodes {nodes}: use 1 to {MAX_NODES}")
    network = _subnet(subnet)
    captures.load(gpu_model)  # fails early, naming the models there are
    names = [f"node{i}" for i in range(1, nodes + 1)]
    base_gpus, gpu_overrides = parse_overrides(gpus, "--gpus", names)
    base_driver, driver_overrides = parse_overrides(drivers, "--driver", names)
    base_rate, rate_overrides = parse_overrides(link_rates, "--link-rate", names)
    base_slowdown, slowdown_overrides = parse_overrides(clock_slowdowns or [],
                                                        "--clock-slowdown", names)
    for reason in [base_slowdown, *slowdown_overrides.values()]:
        if reason is not None and reason not in clock_events.STAGEABLE:
            raise SandboxError(f"--clock-slowdown {reason!r}: use one of "
                               f"{', '.join(clock_events.STAGEABLE)}")
    base_mtu, mtu_overrides = parse_overrides(mtus or [], "--mtu", names)
    for mtu in [base_mtu, *mtu_overrides.values()]:
        if mtu is not None and not (is_number(mtu) and
                                    MTU_RANGE[0] <= int(mtu) <= MTU_RANGE[1]):
            raise SandboxError(f"--mtu {mtu!r}: use an MTU from {MTU_RANGE[0]} to "
                               f"{MTU_RANGE[1]} (9000: jumbo frames)")
    gpu_counts = {n: _gpu_count(gpu_overrides.get(n, base_gpus or "8")) for n in names}
    for rate in [base_rate, *rate_overrides.values()]:
        if rate is not None and not _RATE.fullmatch(rate):
            raise SandboxError(f"--link-rate {rate!r}: write a tc rate like 100mbit or 1gbit")
    if not _LATENCY.fullmatch(latency):
        raise SandboxError(f"--latency {latency!r}: write a time like 1ms or 50ms")
    node_specs = []
    for index, node in enumerate(names):
        driver = driver_overrides.get(node, base_driver)
        if driver is not None and driver not in DRIVER_FAULTS and not _DRIVER.fullmatch(driver):
            raise SandboxError(f"--driver {node}={driver}: write a version like 535.104.05, "
                               f"'failed' (nvidia-smi cannot reach the driver) or 'hung' "
                               f"(nvidia-smi never answers)")
        node_specs.append(NodeSpec(
            name=node, index=index + 1,
            address=str(network.network_address + FIRST_NODE_HOST + index),
            gpu_count=gpu_counts[node], gpu_model=gpu_model,
            driver=None if driver in DRIVER_FAULTS else driver,
            driver_fault=driver if driver in DRIVER_FAULTS else None,
            link_rate=rate_overrides.get(node, base_rate),
            clock_slowdown=slowdown_overrides.get(node, base_slowdown),
            mtu=int(mtu) if (mtu := mtu_overrides.get(node, base_mtu)) else None,
        ))
    return SandboxSpec(name=name, subnet=str(network), nodes=tuple(node_specs),
                       latency=latency, controller_rate=base_rate,
                       base_gpus=_gpu_count(base_gpus or "8"), base_model=gpu_model,
                       login=login)


def _subnet(text: str) -> ipaddress.IPv4Network:
    try:
        network = ipaddress.ip_network(text)
    except ValueError:
        raise SandboxError(f"--subnet {text!r} is not a network like 198.18.0.0/24") from None
    if not isinstance(network, ipaddress.IPv4Network) or not network.subnet_of(SANDBOX_RANGE):
        raise SandboxError(f"--subnet {text}: must lie inside {SANDBOX_RANGE} (the range "
                           f"reserved for benchmarking), so no real network is touched")
    if network.num_addresses < FIRST_NODE_HOST + MAX_NODES + 2:
        raise SandboxError(f"--subnet {text}: use a /24 or larger")
    return network


def _gpu_count(text: str) -> int:
    if not is_number(text) or int(text) > 64:
        raise SandboxError(f"--gpus {text!r}: use a GPU count from 0 to 64 "
                           f"(0 = no GPU and no nvidia-smi)")
    return int(text)
