"""smoke's first round on each node, before any torchrun starts: what would make a run
unfair to others or doomed. A job of ours (or another smoke test) on a GPU this run
would use: an all-reduce of up to 1 GiB beside a training job can run it out of memory.
The rendezvous port held on the head: its torchrun would join whatever holds it. A GPU
chosen that a node lacks."""

from __future__ import annotations

from collections.abc import Mapping

from gpucluster import hostrange, reports
from gpucluster.doctor.checks.network import SIDE_BY_SIDE_FIX
from gpucluster.doctor.gpu_selection import GpuSelection
from gpucluster.inventory import Host, Inventory
from gpucluster.launch.node_scripts import any_job_pattern
from gpucluster.nproc import counted_gpus
from gpucluster.remote.result import CommandResult, FanoutResult
from gpucluster.templating import render
from gpucluster.torchrun import SMOKE_PREFIX

EVERY_GPU = "-"  # a job's CUDA_VISIBLE_DEVICES as the node reports it, where it has none


def command(inventory: Inventory, host: Host) -> str:
    """The checks on `host` (the port on the head only), as report lines."""
    port = inventory.cluster.rendezvous_port if host.name == inventory.head.name else None
    return render("smoke/first_round.sh.j2", node=host.name,
                  any_job_pattern=any_job_pattern(host.name), rendezvous_port=port)


def refusals(inventory: Inventory, written: FanoutResult[CommandResult],
             chosen: GpuSelection | None) -> list[str]:
    """Why the run must not start, from each node's answer; empty where it may."""
    said = {name: reports.by_kind(done.stdout) for name, done in written.values.items()}
    problems = _shared_gpus(said, chosen)
    head = inventory.head.name
    if not problems:  # a job on the head's GPUs holds the port too: said once, above
        problems += [_port_held(inventory, head, port)
                     for port in said.get(head, {}).get("port-busy", [])]
    if chosen is not None:
        short = [host.name for host in inventory.hosts if host.torch_device == "cuda"
                 and (done := written.values.get(host.name)) is not None
                 and (count := counted_gpus(done.stdout)) is not None
                 and count.gpus < len(chosen.entries)]
        if short:
            problems.append(f"{hostrange.fold(short)}: nvidia-smi lists not every GPU of "
                            f"{chosen} there (fix: choose GPUs that nvidia-smi -L lists on "
                            f"every node)")
    return problems


def _shared_gpus(said: Mapping[str, Mapping[str, list[str]]],
                 chosen: GpuSelection | None) -> list[str]:
    """A line per job (folded over its nodes) on a GPU this run would use."""
    sharing: list[tuple[tuple[str, str], str]] = []
    for node, kinds in said.items():
        for line in kinds.get("job-gpus", []):
            job, _, gpus = line.partition(" ")
            if gpus == EVERY_GPU or chosen is None or not chosen.apart_from(gpus):
                sharing.append(((job, gpus), node))
    problems = []
    for (job, gpus), nodes in hostrange.hosts_by(sharing).items():
        where = "every GPU" if gpus == EVERY_GPU else f"GPU {gpus}"
        if job.startswith(SMOKE_PREFIX):
            problems.append(f"{hostrange.fold(nodes)}: another smoke test ({job}) runs on "
                            f"{where} there (fix: let it finish, then run this one)")
            continue
        others = "" if gpus == EVERY_GPU else "; or test the GPUs it leaves free: smoke --gpus LIST"
        problems.append(f"{hostrange.fold(nodes)}: job {job} runs on {where} there, GPUs "
                        f"this test would share with it (fix: let it finish, or end it: "
                        f"gpucluster stop {job}{others})")
    return problems


def _port_held(inventory: Inventory, head: str, port: str) -> str:
    return (f"{head}: port {port} (the rendezvous port) is already held there, by a "
            f"running job of ours or another program (fix: see which with gpucluster jobs, "
            f"or sudo ss -ltnp 'sport = :{port}'; let it finish, or test the GPUs it leaves "
            f"free: smoke --gpus LIST"
            + (SIDE_BY_SIDE_FIX if inventory.cluster.rendezvous_ports == 1 else "") + ")")
