"""The straggler hint: in each job that runs on two or more nodes, the node whose GPUs
of that job are the least busy.

A node is compared only with the other nodes of its own job, on the GPUs that job's
processes hold: an idle node beside a running job is not its straggler (it read as
the slowest node at 0% while another node's job worked), two jobs on their own nodes
are not measured against each other, and the idle GPUs beside a job on 2 of 8 do not
dilute its pace (such a node read 4% beside another's 28%, its job's GPUs at 15%).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpucluster.observe.model import GpuProcess, NodeSample

IDLE_UTIL = 5  # a GPU of a running job below this is idle (a straggler hint)


@dataclass(frozen=True)
class Slowest:
    host: str
    util: float  # mean utilisation of the job's GPUs on that node
    job: str | None  # gpucluster's job id, `slurm-ID`, or None: processes of no known job


def job_of(process: GpuProcess) -> str | None:
    """The job a GPU process belongs to, as `top` names it; None for a foreign one."""
    if process.job is not None:
        return process.job
    return f"slurm-{process.slurm_job}" if process.slurm_job is not None else None


def slowest_per_job(samples: Iterable[tuple[str, NodeSample]]) -> tuple[Slowest, ...]:
    """Each job's least busy node (of its 2+ nodes, when any of its GPUs works), the
    slowest first. Foreign processes count as one job: a job started by hand."""
    by_job: dict[str | None, dict[str, list[int]]] = {}  # job -> host -> its GPUs' util
    for host, sample in samples:
        for gpu in sample.gpus:
            if gpu.util is None:
                continue
            for job in {job_of(p) for p in sample.processes_on(gpu)}:
                by_job.setdefault(job, {}).setdefault(host, []).append(gpu.util)
    slowest = []
    for job, hosts in by_job.items():
        means = {host: sum(utils) / len(utils) for host, utils in hosts.items()}
        if len(means) > 1 and max(means.values()) >= IDLE_UTIL:  # among idle ones, none
            host = min(means, key=lambda h: means[h])
            slowest.append(Slowest(host, means[host], job))
    return tuple(sorted(slowest, key=lambda s: s.util))
