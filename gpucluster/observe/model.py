"""What a node's sampler reports (templates/observe/node_gpus.py), as the controller
keeps it."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from gpucluster import clock_events
from gpucluster.remote.connection import shell_path
from gpucluster.templating import script_text


@dataclass(frozen=True)
class GpuProcess:
    gpu_uuid: str
    pid: int
    used_mib: int | None
    user: str
    state: str  # R, S, D... from /proc
    job: str | None  # the gpucluster job whose marker it carries
    rank: int | None
    local_rank: int | None
    readable: bool = True  # its environment could be read (else: another user's)
    job_running: bool | None = None  # reap's listing only: the job's torchrun still runs
    gpu_index: int | None = None  # reap's listing only: nvidia-smi's index of its GPU
    slurm_job: str | None = None  # the Slurm job whose SLURM_JOB_ID it carries
    slurm_job_running: bool | None = None  # reap's listing only: squeue has it (None: unknown)

    @property
    def owner(self) -> str:
        """running (a job of ours that runs), leftover (of one of ours, or of Slurm's,
        that ended), slurm (a Slurm job that runs, or may: never ours to end) or
        foreign."""
        if self.job is not None:
            return "leftover" if self.job_running is False else "running"
        if self.slurm_job is not None:
            return "leftover" if self.slurm_job_running is False else "slurm"
        return "foreign"


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    bus_id: str
    util: int | None
    mem_used: int | None
    mem_total: int | None
    temp: int | None
    power: float | None
    ecc: int | None  # uncorrected, volatile (since the driver loaded)
    # None where the driver does not report them (an older one, a MIG GPU, a GeForce)
    sm_clock: int | None = None  # MHz
    mem_clock: int | None = None  # MHz
    mem_temp: int | None = None  # C (HBM)
    mem_util: int | None = None  # % of time memory was read or written
    enc_util: int | None = None  # %
    dec_util: int | None = None  # %
    clock_events: int | None = None  # what holds the clocks down: gpucluster.clock_events

    @property
    def slowdowns(self) -> list[str]:
        return clock_events.slowdowns(self.clock_events)


@dataclass(frozen=True)
class NodeSample:
    """One frame of one node."""

    time: float  # the node's clock
    gpus: tuple[Gpu, ...]
    processes: tuple[GpuProcess, ...]
    interface: str | None
    rates: dict[str, tuple[int, int]]  # interface or IB port -> (rx, tx) bytes/s
    load1: float | None
    cpus: int | None
    error: str  # nvidia-smi's, when no GPU answered
    xid: tuple[tuple[str, int | None], ...] | None  # (bus, code) since the sampler began
    extra: dict[str, Any] = field(default_factory=dict)
    # job -> seconds since its newest output or heartbeat on the node (gpucluster.quiet)
    quiet: dict[str, float] = field(default_factory=dict)

    def processes_on(self, gpu: Gpu) -> list[GpuProcess]:
        return [p for p in self.processes if p.gpu_uuid == gpu.uuid]

    def xid_on(self, gpu: Gpu) -> list[int | None]:
        """The Xid codes logged for this GPU."""
        return [code for bus, code in self.xid or () if bus_key(bus) == bus_key(gpu.bus_id)]


def bus_key(bus_id: str) -> tuple[int, ...]:
    """Domain, bus, device: the kernel writes 0000:18:00 where nvidia-smi writes
    00000000:18:00.0."""
    try:
        return tuple(int(part, 16) for part in bus_id.partition(".")[0].split(":")[-3:])
    except ValueError:
        return ()


# The frame's keys of the optional fields, in Gpu's order
EXTRA_GPU_KEYS = ("sm_clock", "mem_clock", "mem_temp", "mem_util", "enc_util", "dec_util",
                  "clock_events")


def node_gpus_command(python: str, *args: str) -> str:
    """The node script (templates/observe/node_gpus.py) run by the node's `python`; `args`
    go as given, each already quoted (or a shell expression the node expands)."""
    return (f"{shell_path(python)} -u -c {shlex.quote(script_text('observe/node_gpus.py'))} "
            + " ".join(args))


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def process_of(raw: dict[str, Any]) -> GpuProcess:
    return GpuProcess(str(raw["gpu_uuid"]), int(raw["pid"]), _int(raw.get("used_mib")),
                      str(raw.get("user", "?")), str(raw.get("state", "?")),
                      raw.get("job") or None, _int(raw.get("rank")),
                      _int(raw.get("local_rank")), bool(raw.get("readable", True)),
                      raw.get("job_running"), _int(raw.get("gpu_index")),
                      raw.get("slurm_job") or None, raw.get("slurm_job_running"))


def parse_frame(line: str) -> NodeSample | None:
    """A sampler's JSON line, or None for anything else (a login banner...)."""
    try:
        raw = json.loads(line)
        gpus = tuple(Gpu(int(g["index"]), str(g["uuid"]), str(g["name"]), str(g["bus_id"]),
                         _int(g["util"]), _int(g["mem_used"]), _int(g["mem_total"]),
                         _int(g["temp"]), _float(g["power"]), _int(g["ecc"]),
                         *(_int(g.get(key)) for key in EXTRA_GPU_KEYS))
                     for g in raw["gpus"])
        processes = tuple(process_of(p) for p in raw["processes"])
        rates = {str(k): (int(v[0]), int(v[1])) for k, v in raw["rates"].items()}
        load = raw.get("load") or [None]
        xid = raw.get("xid")
        quiet = {str(job): float(s) for job, s in (raw.get("quiet") or {}).items()
                 if isinstance(s, (int, float))}
        return NodeSample(float(raw["t"]), tuple(sorted(gpus, key=lambda g: g.index)),
                          processes, raw.get("interface"), rates, _float(load[0]),
                          _int(raw.get("cpus")), str(raw.get("error") or ""),
                          tuple((str(b), _int(c)) for b, c in xid) if xid is not None
                          else None, quiet=quiet)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None
