"""The inventory in the formats neighbouring tools read: Ansible, OpenSSH, DeepSpeed,
MPI, ClusterShell and pdsh. Spares are included, marked as such, where the format can
say so (a group, a comment), and left out of the slot files that launchers read."""

from __future__ import annotations

from collections.abc import Callable

import yaml

from gpucluster import hostrange
from gpucluster.inventory.model import Host, Inventory

SPARES_GROUP = "spares"


def _slots(host: Host) -> int:
    """Processes a launcher should put on the host: its GPUs (1 without)."""
    return host.gpus or 1


def _jump(inventory: Inventory, spec: str) -> str:
    """ProxyJump's `[user@]host[:port]` list; an inventory host by its name becomes its
    address, user and port."""
    hops = []
    for hop in spec.split(","):
        known = next((h for h in inventory.hosts if h.name == hop.strip()), None)
        hops.append(f"{known.user}@{known.address}:{known.port}" if known else hop.strip())
    return ",".join(hops)


def _ssh_options(inventory: Inventory, host: Host) -> list[tuple[str, str]]:
    options = [("HostName", host.address), ("User", host.user), ("Port", str(host.port))]
    identities = host.identity_files or ((host.identity_file,) if host.identity_file else ())
    options += [("IdentityFile", identity) for identity in identities]
    if identities:
        options.append(("IdentitiesOnly", "yes"))
    if host.proxy_command:
        options.append(("ProxyCommand", host.proxy_command))
    elif host.jump_host:
        options.append(("ProxyJump", _jump(inventory, host.jump_host)))
    options += [("UserKnownHostsFile", inventory.cluster.known_hosts),
                ("StrictHostKeyChecking", "yes")]
    return options


def _groups(inventory: Inventory) -> dict[str, list[str]]:
    groups = {name: list(members) for name, members in inventory.groups.items() if members}
    spares = [h.name for h in inventory.hosts if h.spare]
    if spares:
        groups.setdefault(SPARES_GROUP, spares)
    return groups


def ansible(inventory: Inventory) -> str:
    hosts: dict[str, dict[str, object]] = {}
    for host in inventory.hosts:
        options = dict(_ssh_options(inventory, host))
        entry: dict[str, object] = {"ansible_host": host.address, "ansible_user": host.user,
                                    "ansible_port": host.port}
        if host.identity_file:
            entry["ansible_ssh_private_key_file"] = host.identity_file
        extra = [f"-o {name}={options[name]}" for name in ("ProxyCommand", "ProxyJump")
                 if name in options]
        if extra:
            entry["ansible_ssh_common_args"] = " ".join(extra)
        entry.update({"gpus": host.gpus, "gpu_model": host.gpu_model,
                      "gpucluster_spare": host.spare} if host.gpus or host.spare else {})
        entry.update({f"label_{k}": v for k, v in host.labels.items()})
        hosts[host.name] = {k: v for k, v in entry.items() if v is not None}
    document = {"all": {
        "vars": {"ansible_ssh_extra_args": f"-o UserKnownHostsFile="
                                           f"{inventory.cluster.known_hosts} "
                                           f"-o StrictHostKeyChecking=yes"},
        "hosts": hosts,
        "children": {group: {"hosts": {name: None for name in members}}
                     for group, members in _groups(inventory).items()}}}
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False)


def ssh_config(inventory: Inventory) -> str:
    blocks = [f"Host {host.name}\n" + "".join(f"    {name} {_ssh_quote(value)}\n"
                                              for name, value in _ssh_options(inventory, host))
              for host in inventory.hosts]
    return "\n".join(blocks)


def _ssh_quote(value: str) -> str:
    return f'"{value}"' if any(c.isspace() for c in value) else value


def _slot_lines(inventory: Inventory, line: Callable[[Host], str]) -> str:
    lines = [line(h) for h in inventory.hosts if not h.spare]
    lines += [f"# spare: {line(h)}" for h in inventory.hosts if h.spare]
    return "\n".join(lines) + "\n"


def hostfile(inventory: Inventory) -> str:
    """DeepSpeed's hostfile: `name slots=N`."""
    return _slot_lines(inventory, lambda h: f"{h.name} slots={_slots(h)}")


def mpi(inventory: Inventory) -> str:
    """OpenMPI's hostfile (`name slots=N`); MPICH reads `name:N` (format mpich)."""
    return _slot_lines(inventory, lambda h: f"{h.name} slots={_slots(h)}")


def mpich(inventory: Inventory) -> str:
    return _slot_lines(inventory, lambda h: f"{h.name}:{_slots(h)}")


def clush(inventory: Inventory) -> str:
    """A ClusterShell groups file (groups.d/NAME.yaml): one group source named after the
    cluster, `all` plus the inventory's groups, as folded node sets."""
    groups = {"all": [h.name for h in inventory.hosts], **_groups(inventory)}
    return yaml.safe_dump({inventory.cluster.name: {group: hostrange.fold(members)
                                                    for group, members in groups.items()}},
                          sort_keys=False)


def pdsh(inventory: Inventory) -> str:
    """A genders file for pdsh -F FILE -g GROUP: each host with its groups (and `spare`,
    `gpus=N`) as attributes."""
    member_of: dict[str, list[str]] = {h.name: [] for h in inventory.hosts}
    for group, members in _groups(inventory).items():
        for name in members:
            member_of[name].append(group)
    lines = []
    for host in inventory.hosts:
        attributes = ["all", *member_of[host.name]]
        if host.gpus:
            attributes.append(f"gpus={host.gpus}")
        lines.append(f"{host.name} {','.join(attributes)}")
    return "\n".join(lines) + "\n"


FORMATS: dict[str, Callable[[Inventory], str]] = {
    "ansible": ansible, "ssh-config": ssh_config, "hostfile": hostfile, "mpi": mpi,
    "mpich": mpich, "clush": clush, "pdsh": pdsh,
}
# The tools' own names, as the command's help lists them, for the formats above.
FORMAT_ALIASES = {"openssh": "ssh-config", "deepspeed": "hostfile", "openmpi": "mpi",
                  "clustershell": "clush", "genders": "pdsh"}
