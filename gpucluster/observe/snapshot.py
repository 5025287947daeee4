"""The cluster at one moment, from every node's latest frame: what `top` shows, `--json`
prints and the exporter serves; and the one-line summary that points at a straggler."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gpucluster import clock_events
from gpucluster.observe.model import Gpu, GpuProcess, NodeSample
from gpucluster.observe.slowest import IDLE_UTIL, Slowest, job_of, slowest_per_job
from gpucluster.observe.slurm_queue import QueuePoller, QueueReading
from gpucluster.observe.streams import ClusterStreams, stale_after
from gpucluster.quiet import QUIET_SAID_S

SCHEMA = 1


@dataclass(frozen=True)
class NodeView:
    host: str
    sample: NodeSample | None
    age_s: float | None  # since its latest frame came
    stale: bool
    error: str
    ecc_base: dict[str, int]

    def new_ecc(self, gpu: Gpu) -> int | None:
        """Uncorrected ECC errors since `top` first saw the GPU."""
        if gpu.ecc is None:
            return None
        return gpu.ecc - self.ecc_base.get(gpu.uuid, gpu.ecc)


@dataclass(frozen=True)
class Summary:
    slowest: tuple[Slowest, ...]  # each job's least busy node, the slowest first
    busiest: tuple[str, str, int] | None  # node, interface, rx + tx bytes/s
    idle_in_jobs: tuple[tuple[str, int, str], ...]  # node, GPU, job
    busy_gpus: tuple[int, int] = (0, 0)  # GPUs at IDLE_UTIL or more, of all sampled
    # node, GPU, the reasons its clocks are held down (gpucluster.clock_events.SLOWDOWNS)
    slowed: tuple[tuple[str, int, tuple[str, ...]], ...] = ()
    # jobs quiet for QUIET_SAID_S or more on every node sampled, the longest first: job,
    # seconds (the least of its nodes')
    quiet: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Snapshot:
    taken_at: float
    interval_s: float
    nodes: tuple[NodeView, ...]
    slurm: QueueReading | None = None  # Slurm's queue, where Slurm is set up from here

    @property
    def summary(self) -> Summary:
        fresh = [n for n in self.nodes if n.sample is not None and not n.stale]
        links = [(n.host, name, rx + tx) for n in fresh if n.sample
                 for name, (rx, tx) in n.sample.rates.items() if rx + tx > 0]
        gpus = [g for n in fresh if n.sample for g in n.sample.gpus]
        working = sum(1 for g in gpus if g.util is not None and g.util >= IDLE_UTIL)
        slowed = tuple((n.host, g.index, tuple(g.slowdowns)) for n in fresh if n.sample
                       for g in n.sample.gpus if g.slowdowns)
        return Summary(slowest_per_job((n.host, n.sample) for n in fresh if n.sample),
                       max(links, key=lambda x: x[2]) if links else None,
                       tuple(_idle_in_jobs(fresh)), (working, len(gpus)), slowed,
                       _quiet_jobs(fresh))


def _quiet_jobs(nodes: list[NodeView]) -> tuple[tuple[str, float], ...]:
    least: dict[str, float] = {}
    for node in nodes:
        assert node.sample is not None
        for job, seconds in node.sample.quiet.items():
            least[job] = min(seconds, least.get(job, seconds))
    return tuple(sorted(((job, s) for job, s in least.items() if s >= QUIET_SAID_S),
                        key=lambda item: -item[1]))


def _idle_in_jobs(nodes: list[NodeView]) -> list[tuple[str, int, str]]:
    idle = []
    for node in nodes:
        assert node.sample is not None
        for gpu in node.sample.gpus:
            # a Slurm job's too, as `slurm-12`: the exporter's idle-GPU alert covers both
            jobs = {job for p in node.sample.processes_on(gpu) if (job := job_of(p))}
            if jobs and gpu.util is not None and gpu.util < IDLE_UTIL:
                idle.append((node.host, gpu.index, sorted(jobs)[0]))
    return idle


def take(streams: ClusterStreams, slurm: QueuePoller | None = None) -> Snapshot:
    views = []
    for host, stream in streams.nodes.items():
        sample, age, error, ecc_base = stream.view()
        stale = sample is None or age is None or age > stale_after(streams.interval_s)
        views.append(NodeView(host, sample, age, stale, error if stale or not sample
                              or not sample.gpus else "", ecc_base))
    reading = slurm.reading() if slurm is not None else None
    return Snapshot(time.time(), streams.interval_s, tuple(views),
                    reading if reading is not None and reading.set_up else None)


def _slowest_json(slowest: Slowest) -> dict[str, Any]:
    return {"host": slowest.host, "util_pct": round(slowest.util), "job": slowest.job}


def _process_json(process: GpuProcess) -> dict[str, Any]:
    return {"pid": process.pid, "user": process.user, "used_mib": process.used_mib,
            "job": process.job, "rank": process.rank, "local_rank": process.local_rank,
            "slurm_job": process.slurm_job,
            "foreign": process.job is None and process.slurm_job is None}


def _gpu_json(node: NodeView, sample: NodeSample, gpu: Gpu) -> dict[str, Any]:
    return {"index": gpu.index, "uuid": gpu.uuid, "name": gpu.name, "bus_id": gpu.bus_id,
            "util_pct": gpu.util, "mem_used_mib": gpu.mem_used, "mem_total_mib": gpu.mem_total,
            "temp_c": gpu.temp, "power_w": gpu.power, "ecc_errors": node.new_ecc(gpu),
            "sm_clock_mhz": gpu.sm_clock, "mem_clock_mhz": gpu.mem_clock,
            "mem_temp_c": gpu.mem_temp, "mem_util_pct": gpu.mem_util,
            "enc_util_pct": gpu.enc_util, "dec_util_pct": gpu.dec_util,
            "clock_events": clock_events.names(gpu.clock_events)
            if gpu.clock_events is not None else None,
            "xid_errors": sample.xid_on(gpu) if sample.xid is not None else None,
            "processes": [_process_json(p) for p in sample.processes_on(gpu)]}


def node_json(node: NodeView) -> dict[str, Any]:
    sample = node.sample
    rates = sample.rates if sample else {}
    nic = rates.get(sample.interface or "") if sample else None
    return {
        "host": node.host, "stale": node.stale,
        "age_s": round(node.age_s, 1) if node.age_s is not None else None,
        "error": node.error or None,
        "interface": sample.interface if sample else None,
        "rx_bytes_per_s": nic[0] if nic else None, "tx_bytes_per_s": nic[1] if nic else None,
        "infiniband": {name: {"rx_bytes_per_s": rx, "tx_bytes_per_s": tx}
                       for name, (rx, tx) in rates.items() if "/" in name},
        "load1": sample.load1 if sample else None, "cpus": sample.cpus if sample else None,
        "gpus": [_gpu_json(node, sample, g) for g in sample.gpus] if sample else [],
    }


def to_json(snapshot: Snapshot) -> dict[str, Any]:
    summary = snapshot.summary
    return {
        "schema": SCHEMA, "time": round(snapshot.taken_at, 3),
        "interval_s": snapshot.interval_s,
        "nodes": [node_json(n) for n in snapshot.nodes],
        "summary": {
            "slowest_node": _slowest_json(summary.slowest[0]) if summary.slowest else None,
            "slowest_nodes": [_slowest_json(s) for s in summary.slowest],
            "busiest_link": {"host": summary.busiest[0], "interface": summary.busiest[1],
                             "bytes_per_s": summary.busiest[2]} if summary.busiest else None,
            "idle_gpus_in_jobs": [{"host": h, "gpu": g, "job": j}
                                  for h, g, j in summary.idle_in_jobs],
            "slowed_gpus": [{"host": h, "gpu": g, "reasons": list(reasons)}
                            for h, g, reasons in summary.slowed],
            "quiet_jobs": [{"job": j, "quiet_s": s} for j, s in summary.quiet],
        },
        "slurm": _slurm_json(snapshot.slurm),
    }


def _slurm_json(reading: QueueReading | None) -> dict[str, Any] | None:
    """null where Slurm is not set up from here."""
    if reading is None:
        return None
    return {"up": not reading.error, "error": reading.error or None,
            "jobs": None if reading.error else reading.by_state()}
