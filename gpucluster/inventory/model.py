"""The inventory as values: frozen, validated hosts and cluster settings."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpucluster import hostrange
from gpucluster.errors import GpuclusterError
from gpucluster.ssh_config import DEFAULT_SSH_CONFIG
from gpucluster.wording import endpoint


@dataclass(frozen=True)
class Host:
    """One node, fully resolved: inventory, defaults and ~/.ssh/config merged."""

    name: str
    address: str
    user: str
    port: int = 22
    identity_file: str | None = None
    jump_host: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    gpus: int | None = None
    gpu_model: str | None = None
    groups: tuple[str, ...] = ()
    connection: str = "ssh"  # "ssh" or "local"
    # From ~/.ssh/config: every IdentityFile to try (identity_file first), a ProxyCommand,
    # a ConnectTimeout (over the inventory's).
    identity_files: tuple[str, ...] = ()
    proxy_command: str | None = None
    connect_timeout: float | None = None
    torch_device: str = "cuda"  # "cpu": jobs here run torch on the CPU, GPUs or not
    spare: bool = False  # kept out of jobs; launch --recover puts it in for a lost node
    line: int | None = None

    @property
    def is_local(self) -> bool:
        return self.connection == "local"

    @property
    def endpoint(self) -> str:
        """Where it is reached: its address, and its port unless 22."""
        return self.address if self.port == 22 else endpoint(self.address, self.port)

    @property
    def jobs_use_gpus(self) -> bool:
        """Jobs get this host's GPUs: one process per GPU, GPUs passed into containers."""
        return bool(self.gpus) and self.torch_device == "cuda"


@dataclass(frozen=True)
class ClusterSettings:
    """Settings that apply to the cluster as a whole."""

    name: str = "gpucluster"  # names what provision leaves on nodes: key, blocks, rule tags
    rendezvous_port: int = 29500
    # Jobs side by side on one head (launch --gpus): a job whose first GPU is k takes
    # rendezvous_port + k, where k is below this; provision's firewall opens them all.
    rendezvous_ports: int = 1
    python: str = "python3"
    torchrun: str = "torchrun"
    env: Mapping[str, str] = field(default_factory=dict)
    image: str | None = None
    work_dir: str = "~/gpucluster"
    known_hosts: str = "~/.ssh/known_hosts"
    ssh_config: str = DEFAULT_SSH_CONFIG
    connect_timeout: float = 10.0
    command_timeout: float = 120.0
    fanout: int = 64
    log_max_mb: int = 100  # the controller's copy of one job's logs, all nodes together


@dataclass(frozen=True)
class SmokeSettings:
    """Pass/fail thresholds for the all-reduce smoke test."""

    min_busbw_gbps: float | None = None


@dataclass(frozen=True)
class SlurmSettings:
    """Slurm on the provisioned nodes (`slurm:` in the inventory, or provision --with
    slurm with these defaults)."""

    enabled: bool = True  # the section is there: every provision includes the step
    controller: str | None = None  # the host running slurmctld; None: the head
    partition: str = "gpu"
    install: bool = False  # may provision install missing Slurm and munge packages?
    cgroups: bool = True  # cgroup plugins (ConstrainDevices); off where nodes share a host
    srun_ports: str = "61000-61999"  # outside the kernel's ephemeral range
    # SlurmdTimeout: a node silent this long is down, and its jobs are requeued. Slurm's
    # 300 s default leaves a job hung for 5-7 minutes on a dead node.
    node_timeout: int = 60


@dataclass(frozen=True)
class Inventory:
    """A validated inventory; hosts keep the order of the file."""

    path: Path
    cluster: ClusterSettings
    hosts: tuple[Host, ...]
    groups: Mapping[str, tuple[str, ...]]
    smoke: SmokeSettings = SmokeSettings()
    slurm: SlurmSettings | None = None  # None: no `slurm:` section
    # Hosts a -w/-g selection left out: no work runs there, but a selected host may
    # still reach its node through one of them (jump_host).
    left_out: tuple[Host, ...] = ()

    @property
    def head(self) -> Host:
        """The rendezvous host: the first host of the file."""
        return self.hosts[0]

    @property
    def has_machine_pairs(self) -> bool:
        """Two hosts or more, not all of them this machine: something to test between
        nodes (doctor's port mesh, its SSH ring)."""
        return len(self.hosts) >= 2 and not all(h.is_local for h in self.hosts)

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise GpuclusterError(f"{self.path}: no host named {name!r} in the inventory")

    def restricted_to(self, hosts: list[Host]) -> Inventory:
        """This inventory with only `hosts` (the first of them becomes the head)."""
        names = {h.name for h in hosts}
        return replace(self, hosts=tuple(h for h in self.hosts if h.name in names),
                       groups={g: tuple(m for m in members if m in names)
                               for g, members in self.groups.items()},
                       left_out=(*self.left_out,
                                 *(h for h in self.hosts if h.name not in names)))

    def select(self, patterns: str | None = None, group: str | None = None) -> list[Host]:
        """Hosts named by a range list (`gpu[01-04],login1`) and/or in a group."""
        selected = list(self.hosts)
        if group is not None:
            if not group.strip():  # `-g "$GROUP"` with the variable unset
                raise GpuclusterError(f"--group {group!r} names no group (fix: a group of "
                                      f"{self.path.name}, or no --group for every host)")
            if group not in self.groups:
                raise GpuclusterError(f"{self.path}: no group {group!r} "
                                      f"({self._groups_fix(group)})")
            members = set(self.groups[group])
            selected = [h for h in selected if h.name in members]
        if patterns is not None:
            wanted = hostrange.hosts_option(patterns)
            names = {h.name for h in self.hosts}
            unknown = [n for n in wanted if n not in names]
            if unknown:
                raise GpuclusterError(
                    f"{self.path}: --hosts names unknown hosts: {hostrange.fold(unknown)} "
                    f"(fix: the inventory's hosts are "
                    f"{hostrange.fold(h.name for h in self.hosts)})")
            chosen = set(wanted)
            selected = [h for h in selected if h.name in chosen]
        if not selected and group is not None:
            both = f"both in --hosts {patterns} and " if patterns is not None else ""
            listed = hostrange.fold(self.groups[group])
            raise GpuclusterError(f"{self.path}: no host is {both}in group {group!r} (fix: "
                                  + (f"group {group!r} is {listed})" if listed else
                                     "the group lists no host)"))
        return selected

    def _groups_fix(self, group: str) -> str:
        known = sorted(self.groups)
        if not known:
            return (f"groups: none defined; fix: add `groups: {{{group}: [HOSTS]}}` to the "
                    f"inventory, or `groups: [{group}]` to its hosts")
        guess = difflib.get_close_matches(group, known, n=1)
        return f"groups: {', '.join(known)}" + (f"; fix: did you mean {guess[0]}?"
                                                 if guess else "")


def is_ip(text: str) -> bool:
    """True for an IPv4 or IPv6 address (not a DNS name)."""
    import ipaddress

    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
