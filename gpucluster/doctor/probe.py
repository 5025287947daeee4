"""The batched probe: one shell script per node, one round trip, every fact in sections.

`render_probe` builds the script for the cluster; `parse_facts` turns its output into
`NodeFacts`, tolerating sections that are missing (a tool not installed) or garbled.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field

from gpucluster import reports
from gpucluster.doctor import node_tools, nvidia_smi, torch_facts
from gpucluster.doctor.torch_facts import TORCH_SCRIPT, TorchBuild, TorchFacts
from gpucluster.inventory import Inventory
from gpucluster.remote.connection import shell_path, typed_sudo_context
from gpucluster.reports import Section
from gpucluster.templating import render, script_text

TOOL_TIMEOUT_S = 15
NO_IP = "@no-ip"  # the addresses section: the node has no `ip` command
# A node's first torch import has a limit of its own: from a cold disk or an NFS venv, or
# on a busy node, it can take longer than a tool. (16 sandbox nodes importing at once on
# two cores took 19 s each: cut at 15 s, none was cached, and every later doctor run
# imported again.) Below the probe's own default limit of 60 s.
TORCH_IMPORT_TIMEOUT_S = 45

@dataclass
class PortMesh:
    """One node's part of the port mesh: its ephemeral range (`32768:60999`), whether it
    listened (`ok`, `busy`, `error ...`), and each peer address's state as it saw it."""

    port: int | None = None
    range: str = ""
    listen: str = ""
    peers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeFacts:
    """Everything the probe learned about one node."""

    sections: dict[str, Section] = field(default_factory=dict)
    clock_offset_s: float | None = None  # node clock minus controller clock
    # From sending the probe to its first line: the node's login scripts, mostly.
    login_s: float | None = None

    def text(self, name: str) -> str | None:
        section = self.sections.get(name)
        return section.output if section is not None else None

    def ok_text(self, name: str) -> str | None:
        """The section's output when its command succeeded and printed something."""
        section = self.sections.get(name)
        if section is None or section.exit_code != 0 or not section.output.strip():
            return None
        return section.output.strip()

    @property
    def hostname(self) -> str | None:
        return self.ok_text("hostname")

    def jobs_here(self, node: str) -> dict[str, str]:
        """gpucluster jobs with a live process on `node` (marked in their env), by id:
        `running`, or `ended` where the job's torchrun is gone and processes of it are
        left (a line without a state, from a probe before states: running)."""
        jobs: dict[str, str] = {}
        for job, state, _ in self._job_lines(node):
            jobs[job] = "running" if jobs.get(job) == "running" else state
        return dict(sorted(jobs.items()))

    def job_gpus_here(self, node: str) -> dict[str, str | None]:
        """The running jobs' CUDA_VISIBLE_DEVICES on `node` (launch --gpus), by id;
        None where a job has all of them, or it is not known."""
        return {job: gpus for job, state, gpus in self._job_lines(node) if state == "running"}

    def _job_lines(self, node: str) -> list[tuple[str, str, str | None]]:
        """`MARKER STATE GPUS` lines of the jobs section: (job, state, GPUs or None)."""
        found = []
        for line in (self.text("jobs") or "").splitlines():
            marked, *rest = line.split(" ")
            state = rest[0] if rest and rest[0] in ("running", "ended") else "running"
            gpus = rest[1] if len(rest) > 1 and rest[1] != "-" else None
            job, _, where = marked.removeprefix("GPUCLUSTER_JOB=").rpartition("@")
            if job and where == node:
                found.append((job, state, gpus))
        return found

    @property
    def has_nvidia_smi(self) -> bool:
        return self.ok_text("nvidia_smi_path") is not None

    @property
    def gpus(self) -> list[nvidia_smi.Gpu]:
        return nvidia_smi.parse_gpus(self.text("gpus") or "")

    @property
    def driver_failure(self) -> str | None:
        section = self.sections.get("gpus")
        if section is None:
            return None
        failure = nvidia_smi.driver_failure(section.output, section.exit_code)
        return failure if failure is not None and not self.gpus else None

    @property
    def versions(self) -> nvidia_smi.DriverVersions:
        return nvidia_smi.parse_versions(self.text("nvidia_version") or "")

    @property
    def torch_build(self) -> TorchBuild | None:
        """None where no torch was found, or its version.py names no `cuda`."""
        return torch_facts.parse_build(self.text("torch_build"))

    @property
    def torch(self) -> TorchFacts | None:
        """None when the probe could not run python at all."""
        return torch_facts.parse_versions(self.text("torch"))

    @property
    def resolved(self) -> dict[str, str | None]:
        """Inventory host name -> the address it resolves to here (None: it does not)."""
        from gpucluster.doctor.rendezvous import parse_resolved

        names = [line.split()[1:] for line in (self.text("resolve") or "").splitlines()]
        known = sorted({n for aliases in names for n in aliases})
        return parse_resolved(self.text("resolve") or "", known)

    @property
    def port(self) -> str | None:
        """The head's rendezvous port as seen from here; None when not probed."""
        return self.ok_text("port")

    @property
    def mesh(self) -> PortMesh | None:
        """What this node's part of the port mesh saw; None when it did not run."""
        section = self.sections.get("peers")
        if section is None:
            return None
        mesh = PortMesh()
        for line in section.output.splitlines():
            word, _, rest = line.strip().partition(" ")
            if word == "port" and rest.isdigit():
                mesh.port = int(rest)
            elif word == "range" and len(rest.split()) == 2:
                mesh.range = rest.replace(" ", ":")
            elif word == "listen":
                mesh.listen = rest
            elif word == "peer" and " " in rest:
                address, _, state = rest.partition(" ")
                mesh.peers[address] = state
        if not mesh.listen:  # no python, or it died: what it said instead
            mesh.listen = "error " + (section.output.strip()[-200:] or
                                      f"exit {section.exit_code}")
        return mesh

    @property
    def interfaces(self) -> dict[str, str]:
        """IPv4 address -> interface name."""
        return {address: name for address, (name, _) in self._addresses().items()}

    @property
    def mtus(self) -> dict[str, int]:
        """IPv4 address -> its interface's MTU, where the node could read it."""
        return {address: mtu for address, (_, mtu) in self._addresses().items()
                if mtu is not None}

    def _addresses(self) -> dict[str, tuple[str, int | None]]:
        found: dict[str, tuple[str, int | None]] = {}
        for line in (self.text("addresses") or "").splitlines():
            parts = line.split()
            if len(parts) in (2, 3) and "/" in parts[1]:
                mtu = int(parts[2]) if len(parts) == 3 and parts[2].isdigit() else None
                found[parts[1].split("/")[0]] = (parts[0], mtu)
        return found

    @property
    def lists_interfaces(self) -> bool:
        """False where the node has no `ip` to list them with (a minimal image)."""
        return NO_IP not in (self.text("addresses") or "")

    @property
    def infiniband(self) -> dict[str, tuple[str, str]]:
        """`mlx5_0/1` -> (state, rate)."""
        ports: dict[str, tuple[str, str]] = {}
        for line in (self.text("infiniband") or "").splitlines():
            port, _, rest = line.strip().partition(" ")
            state, _, rate = rest.partition("|")
            if port and not port.startswith("*"):
                ports[port] = (state.strip(), rate.strip())
        return ports

    def df_available_bytes(self, name: str) -> int | None:
        return self._df_kib(name, column=3)

    def df_size_bytes(self, name: str) -> int | None:
        return self._df_kib(name, column=1)

    def _df_kib(self, name: str, column: int) -> int | None:
        """A column of a `df -Pk` data line (1: size, 3: available), in bytes."""
        text = self.ok_text(name)
        parts = text.split() if text else []
        if len(parts) > column and parts[column].isdigit():
            return int(parts[column]) * 1024
        return None

    @property
    def runtimes(self) -> dict[str, str]:
        return _name_value_lines(self.text("runtimes"))

    @property
    def container_toolkit(self) -> dict[str, str]:
        return _name_value_lines(self.text("container_toolkit"))


def _name_value_lines(text: str | None) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in (text or "").splitlines():
        name, _, rest = line.strip().partition(" ")
        if name:
            found[name] = rest.strip()
    return found


# What each probe step runs that can be slow, for the message when time runs out.
SLOW_STEPS = {
    "torch_build": "finding torch with cluster.python (python's start)",
    "torch": "importing torch with cluster.python (a node's first import can take many "
             "seconds; its versions are cached after it)",
    "nvidia_version": "nvidia-smi --version (a wedged GPU or driver hangs nvidia-smi)",
    "gpus": "nvidia-smi --query-gpu (a wedged GPU or driver hangs nvidia-smi)",
    "apps": "nvidia-smi --query-compute-apps (a wedged GPU or driver hangs nvidia-smi)",
    "nvcc": "nvcc --version",
    "runtimes": "the container runtimes' --version",
    "container_toolkit": "the NVIDIA container toolkit's --version",
    "xid": "reading dmesg",
    "port": "connecting to the head's rendezvous port",
    "peers": "the port mesh: every node listening on one port, connecting to every other",
    "sudo": "sudo -n true",
    "slurm": "sinfo (slurmctld not answering?)",
}


class ProbeSteps:
    """Follows the probe's output as it streams, so that a probe cut off by its time
    limit can say which step it was in and how long that step had run."""

    def __init__(self) -> None:
        self.current: str | None = None
        self.started = 0.0
        self.done: list[str] = []

    def see(self, stream: str, line: str) -> None:
        if stream != "stdout":
            return
        kind, rest = reports.parse(line) or ("", "")
        if kind == "section":
            self.current, self.started = rest, time.monotonic()
        elif kind == "end" and self.current is not None:
            self.done.append(self.current)
            self.current = None

    def timeout_message(self, limit_s: float) -> str:
        if self.current is None:
            where = (f"after its {self.done[-1]!r} step" if self.done else
                     "before it printed anything (a slow login or shell start)")
            return f"the probe did not finish within --timeout {limit_s:g}s: stalled {where}"
        what = SLOW_STEPS.get(self.current, "")
        return (f"the probe did not finish within --timeout {limit_s:g}s: its "
                f"{self.current!r} step had run {time.monotonic() - self.started:.1f}s"
                + (f": {what}" if what else ""))


ALWAYS_PROBED = frozenset({"clock", "hostname"})  # the clock offset, the name check


def render_probe(inventory: Inventory, sections: frozenset[str] | None = None,
                 typed_sudo: bool = False) -> str:
    """The probe script for this cluster (paths and peer names quoted): every section,
    or only `sections` (and ALWAYS_PROBED). Run with GPC_CONNECT=1 in its environment,
    it also tests the head's rendezvous port. `typed_sudo`: its stdin's first line is
    the --ask-sudo-pass password, tried once and then used for the kernel log."""
    from gpucluster.doctor.checks import ssh_mesh
    from gpucluster.doctor.rendezvous import connect_script
    from gpucluster.slurm_states import ENDED_JOB_STATES, SINFO, where_set_up

    wanted = None if sections is None else sections | ALWAYS_PROBED
    return render(
        "doctor/probe.sh.j2", want=lambda name: wanted is None or name in wanted,
        **typed_sudo_context(typed_sudo),
        python=inventory.cluster.python,
        torchrun=inventory.cluster.torchrun, work_dir=shell_path(inventory.cluster.work_dir),
        tool_timeout=TOOL_TIMEOUT_S, torch_timeout=TORCH_IMPORT_TIMEOUT_S,
        torch_script=TORCH_SCRIPT,
        query_fields=",".join(nvidia_smi.QUERY_FIELDS), no_ip=NO_IP,
        app_fields=",".join(nvidia_smi.APP_FIELDS),
        names=" ".join(shlex.quote(h.name) for h in inventory.hosts),
        slurm_sinfo=where_set_up(f"t {SINFO} 2>&1"), slurm_ended=ENDED_JOB_STATES,
        connect=connect_script(inventory.head, inventory.cluster.rendezvous_port),
        mesh=script_text("doctor/port_mesh.py"),
        ssh_connect=ssh_mesh.CONNECT_TIMEOUT_S, ssh_limit=ssh_mesh.LOGIN_TIMEOUT_S,
        node_tools=sorted(node_tools.COMMANDS), gnu_forms=node_tools.GNU_FORMS)


def parse_facts(output: str, sent_at: float, clock_seen_at: float | None = None) -> NodeFacts:
    """Facts from the probe's output.

    The node reads its clock first thing; the true offset lies between its reading minus
    `clock_seen_at` (when the controller received that line) and its reading minus
    `sent_at`. A clock inside that window may be exact, so it counts as 0; outside, the
    offset is the distance to the window, a lower bound on the real skew.
    """
    sections = reports.sections(output)
    offset = None
    clock = sections.get("clock")
    if clock is not None:
        try:
            node_time = float(clock.output.strip())
        except ValueError:
            node_time = None
        if node_time is not None:
            latest = clock_seen_at if clock_seen_at is not None else sent_at
            offset = (node_time - sent_at if node_time < sent_at else
                      node_time - latest if node_time > latest else 0.0)
    login = clock_seen_at - sent_at if clock_seen_at is not None else None
    return NodeFacts(sections, offset, login)
