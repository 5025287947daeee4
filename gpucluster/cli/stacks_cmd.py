"""`gpucluster stacks`: where each rank of a running job is now, read by py-spy on every
node, without stopping it (`stop --stacks` ends a hung job and says where it was)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated

import typer

from gpucluster import hostrange
from gpucluster.cli.launch_cmd import job_store
from gpucluster.cli.options import (
    AcceptNewOption,
    AskPassOption,
    ConnectTimeoutOption,
    InventoryOption,
    JsonOption,
    load_inventory,
    open_session,
    stderr_console,
    stdout_console,
)
from gpucluster.cli.views import common
from gpucluster.errors import EXIT_FAILED, GpuclusterError

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from gpucluster.inventory import Inventory
    from gpucluster.launch.live_stacks import NodeStacks
    from gpucluster.remote.session import Session


def stacks(
    job: Annotated[str | None, typer.Argument(
        metavar="[JOB]", help="A job id, a unique part of it, or 'last' (the default: the "
                              "newest job); slurm-ID for a Slurm job.")] = None,
    native: Annotated[bool, typer.Option(
        "--native", help="C and C++ frames too (NCCL, CUDA calls), among the Python "
                         "ones; slower to read.")] = False,
    inventory: InventoryOption = None,
    json_output: JsonOption = False,
    accept_new_host_keys: AcceptNewOption = False,
    ask_pass: AskPassOption = False,
    connect_timeout: ConnectTimeoutOption = None,
) -> None:
    """Say where each rank of a running job is now, without stopping it: py-spy reads
    every worker's Python stack on every node at once (each is paused for the moment of
    the read), and ranks at the same place share a line; the one elsewhere is usually
    the one to look at. Every rank's whole stack is kept beside the job's logs. Needs
    py-spy on the nodes, on the PATH or beside the job's Python. JOB slurm-ID reads a
    Slurm job's ranks on the nodes Slurm runs it on."""
    from gpucluster.cli.views import stacks as view
    from gpucluster.launch import hang_stacks, live_stacks
    from gpucluster.slurm.queue import slurm_job

    slurm_id = slurm_job(job)
    loaded = load_inventory(inventory)
    store = job_store(loaded)
    with open_session(loaded, accept_new_host_keys, ask_pass, connect_timeout) as session:
        if slurm_id is None:
            record = store.load(job)
            job_id, looked = record.id, live_stacks.look(session, loaded, record, native)
        else:
            job_id, looked = f"slurm-{slurm_id}", _slurm_look(session, loaded, slurm_id,
                                                               native)
    groups = live_stacks.read(looked)
    if not any(result.workers or result.error for result in looked.values()):
        raise GpuclusterError(_no_rank(job_id, looked, store.directory(job_id)))
    if groups and all(group.why == "no-spy" for group in groups):
        raise GpuclusterError("py-spy is not installed on " + hostrange.fold(sorted(
            {node for group in groups for node in group.nodes})) +
            f" (fix: {live_stacks.PY_SPY_FIX})")
    name = time.strftime("stacks-%Y%m%d-%H%M%S.txt")
    kept = hang_stacks.write(store.directory(job_id),
                             {node: result.dumps for node, result in looked.items()}, name)
    if json_output:
        common.print_json(stdout_console(), view.stacks_payload(job_id, looked, groups, kept))
    else:
        view.print_stacks(stdout_console(), stderr_console(), job_id, looked, groups, kept)
    if any(result.error for result in looked.values()) or any(g.why for g in groups):
        raise typer.Exit(EXIT_FAILED)


def _slurm_look(session: Session, inventory: Inventory, slurm_id: str, native: bool
                ) -> dict[str, NodeStacks]:
    """A Slurm job's ranks, on the nodes Slurm runs it on (those the inventory lists)."""
    from gpucluster.launch import live_stacks
    from gpucluster.slurm.follow import running_nodes
    from gpucluster.slurm.queue import set_up_from_here

    if not set_up_from_here(inventory):
        raise GpuclusterError(f"slurm-{slurm_id}: Slurm is not set up for {inventory.path} "
                              f"(fix: gpucluster provision --with slurm)")
    nodes = running_nodes(session, slurm_id, "gpucluster jobs lists Slurm's queue")
    hosts = [host for host in inventory.hosts if host.name in nodes]
    if not hosts:
        raise GpuclusterError(f"Slurm job {slurm_id} runs on {hostrange.fold(nodes)}, none "
                              f"of them in {inventory.path} (fix: -i with the inventory "
                              f"that names them)")
    return live_stacks.look_slurm(session, hosts, slurm_id, native)


def _no_rank(job_id: str, looked: Mapping[str, NodeStacks], directory: Path) -> str:
    """Why no rank was read: the job has not started its workers yet, or it ended; a
    Slurm job's ranks are its processes with a RANK (torchrun's workers)."""
    from gpucluster.launch.hang_stacks import STACKS_FILE

    nodes = hostrange.fold(sorted(looked))
    if job_id.startswith("slurm-"):
        return f"Slurm job {job_id[6:]} has no process with a RANK on {nodes} (its ranks " \
               "are torchrun's workers: is it still starting them, or not a torchrun job?)"
    if any(result.processes for result in looked.values()):
        return f"job {job_id} has no worker yet on {nodes}: torchrun is starting them (" \
               "the rendezvous waits for every node): ask again in a moment"
    kept = directory / STACKS_FILE
    return f"job {job_id} has no rank running on {nodes} (gpucluster jobs says how it " \
           "ended" + (f"; where each rank was as its hang was stopped: {kept})"
                      if kept.is_file() else ")")

