"""What one node tells the slurm step, gathered in one round trip: its hardware in
`slurmd -C` form, its GPUs, which Slurm and munge commands it has, which daemons run,
how it starts services, and the state of the files the step writes."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpucluster import hostrange, reports
from gpucluster.templating import render

# Commands every node needs, and those only the controller host needs.
NODE_COMMANDS = ("slurmd", "munged", "munge", "unmunge")
CONTROLLER_COMMANDS = ("slurmctld", "scontrol", "sinfo", "srun", "sbatch")
# Where distributions keep slurmd's plugins (the NVML one tells AutoDetect=nvml works).
PLUGIN_DIRS = ("/usr/lib/x86_64-linux-gnu/slurm-wlm", "/usr/lib/aarch64-linux-gnu/slurm-wlm",
               "/usr/lib64/slurm", "/usr/lib/slurm", "/usr/local/lib/slurm")
# The package that gives each command, per package manager.
PACKAGES = {
    "apt-get": {"slurmd": "slurmd", "slurmctld": "slurmctld", "munged": "munge",
                "munge": "munge", "unmunge": "munge", "scontrol": "slurm-client",
                "sinfo": "slurm-client", "srun": "slurm-client", "sbatch": "slurm-client"},
    "dnf": {"slurmd": "slurm-slurmd", "slurmctld": "slurm-slurmctld", "munged": "munge",
            "munge": "munge", "unmunge": "munge", "scontrol": "slurm", "sinfo": "slurm",
            "srun": "slurm", "sbatch": "slurm"},
}
PACKAGES["yum"] = PACKAGES["dnf"]
INSTALL = {"apt-get": "DEBIAN_FRONTEND=noninteractive apt-get install -y",
           "dnf": "dnf install -y", "yum": "yum install -y"}
HARDWARE_FIELDS = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore",
                   "RealMemory")
_TYPE_NOISE = {"nvidia", "tesla", "geforce", "quadro"}


@dataclass(frozen=True)
class NodeFacts:
    host: str  # the inventory's name
    address: str
    node_name: str  # Slurm's NodeName: the node's short hostname, as slurmd -C says
    hardware: Mapping[str, str]  # HARDWARE_FIELDS, from slurmd -C
    gpu_names: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()  # /dev/nvidiaN
    nvml: bool = False  # slurmd has its NVML plugin
    systemd: bool = False
    commands: frozenset[str] = frozenset()
    package_manager: str | None = None
    daemons: frozenset[str] = frozenset()  # running: munged, slurmctld, slurmd
    key: str | None = None  # the munge key: "MODE OWNER GROUP SHA256", None: absent
    files: Mapping[str, reports.Section] = field(default_factory=dict)

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_names)

    @property
    def gpu_type(self) -> str:
        return gpu_type(self.gpu_names[0]) if self.gpu_names else "gpu"

    @property
    def hardware_line(self) -> str:
        return " ".join(f"{k}={self.hardware[k]}" for k in HARDWARE_FIELDS
                        if k in self.hardware)

    @property
    def uncountable(self) -> bool:
        """GPUs Slurm cannot count: no NVML plugin and no device files (slurmd counts a
        GPU by its File, and registers none without one)."""
        return bool(self.gpu_count) and not self.nvml and not self.devices

    @property
    def gres(self) -> str:
        """slurm.conf's Gres= value, "" without GPUs."""
        return f"gpu:{self.gpu_type}:{self.gpu_count}" if self.gpu_count else ""

    @property
    def device_range(self) -> str:
        return hostrange.fold(self.devices)


def gpu_type(name: str) -> str:
    """A GRES type from nvidia-smi's name: "NVIDIA H100 80GB HBM3" -> h100,
    "NVIDIA A100-SXM4-80GB" -> a100, "NVIDIA GeForce RTX 4090" -> rtx4090."""
    words = [w for w in re.split(r"[\s]+", name.strip()) if w.lower() not in _TYPE_NOISE]
    if not words:
        return "gpu"
    first = words[0].split("-")[0]
    if first.upper() == "RTX" and len(words) > 1:
        first += words[1].split("-")[0]
    return re.sub(r"[^a-z0-9_]", "", first.lower()) or "gpu"


def facts_script() -> str:
    nvml = " ".join(shlex.quote(f"{d}/gpu_nvml.so") for d in PLUGIN_DIRS)
    return render("slurm/facts.sh.j2", commands=[*NODE_COMMANDS, *CONTROLLER_COMMANDS],
                  nvml_plugins=nvml)


def parse_hardware(line: str) -> tuple[str, dict[str, str]]:
    """`slurmd -C`'s first line -> (NodeName, {field: value})."""
    pairs = dict(part.split("=", 1) for part in line.split() if "=" in part)
    return pairs.get("NodeName", ""), {k: pairs[k] for k in HARDWARE_FIELDS if k in pairs}


def parse_facts(host: str, address: str, output: str) -> NodeFacts:
    found = reports.sections(output)

    def lines(name: str) -> list[str]:
        section = found.get(name)
        return [ln.strip() for ln in section.output.splitlines() if ln.strip()] \
            if section else []

    hardware = lines("hardware")
    node_name, fields = parse_hardware(hardware[0]) if hardware else ("", {})
    key = lines("key")
    managers = lines("packages")
    return NodeFacts(
        host=host, address=address, node_name=node_name, hardware=fields,
        gpu_names=tuple(lines("gpus")) if found.get("gpus", reports.Section("", 1)).exit_code
        == 0 else (),
        devices=tuple(sorted(lines("devices"), key=lambda d: int(re.sub(r"\D", "", d) or 0))),
        nvml=bool(lines("nvml")), systemd=lines("systemd") == ["yes"],
        commands=frozenset(lines("commands")),
        package_manager=managers[0] if managers else None,
        daemons=frozenset(lines("daemons")),
        key=" ".join(key) if len(key) == 2 else None,
        files={name: section for name, section in found.items() if name.isdigit()})


def missing(facts: NodeFacts, controller: bool) -> list[str]:
    """The commands this node lacks for its part."""
    needed = [*NODE_COMMANDS, *(CONTROLLER_COMMANDS if controller else ())]
    return [c for c in needed if c not in facts.commands]


def install_command(facts: NodeFacts, commands: list[str]) -> str | None:
    """The command that installs what gives `commands`; None for an unknown system."""
    table = PACKAGES.get(facts.package_manager or "")
    if table is None:
        return None
    packages = sorted({table[c] for c in commands})
    return f"{INSTALL[facts.package_manager or '']} {' '.join(packages)}"
