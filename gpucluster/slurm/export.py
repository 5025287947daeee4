"""Write the sbatch script for a job, after putting its work dir on every node as
launch does (only what changed is sent), or, with a shared filesystem, saying where
it must be."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from gpucluster import hostrange
from gpucluster.errors import GpuclusterError
from gpucluster.inventory import Inventory
from gpucluster.launch import workdir
from gpucluster.launch.model import LaunchRequest
from gpucluster.launch.request import check_request
from gpucluster.launch.start import code_dir_for, sync_summary
from gpucluster.nproc import check_nproc
from gpucluster.remote.result import FanoutResult
from gpucluster.remote.session import Session
from gpucluster.slurm.sbatch import SbatchRequest, sbatch_script


def export_sbatch(session: Session, inventory: Inventory, root: Path, script: str,
                  args: Sequence[str], sync: bool, nodes: int | None = None,
                  nproc_per_node: int | None = None, env: Mapping[str, str] | None = None,
                  image: str | None = None, output_name: str = "job.sbatch",
                  module: bool = False, debug: bool = False) -> tuple[str, str]:
    """(the script, what was done about the work dir)."""
    if nodes is not None and nodes > len(inventory.hosts):  # Slurm would hold it for ever
        raise GpuclusterError(f"-N {nodes}: the cluster has {len(inventory.hosts)} nodes, so "
                              f"Slurm could never run the job (fix: -N {len(inventory.hosts)}"
                              f" or fewer)")
    check_nproc(inventory, nproc_per_node)  # else the ranks past the GPUs Slurm gave fail
    files, relative = check_request(LaunchRequest(script, tuple(args), root, module=module))
    code_dir = code_dir_for(inventory, root)
    if sync:
        synced = _sync_every_node(session, inventory, root, files, code_dir)
        if synced.failures:
            failed = sorted(synced.failures)
            first = synced.failures[failed[0]].message
            raise GpuclusterError(f"the work dir could not be synced to "
                                  f"{hostrange.fold(failed)} ({first}); no script written")
        note = sync_summary(synced.values)
    else:
        note = f"not synced (--no-sync): the script expects the work dir at {code_dir} on " \
               f"every node"
    request = SbatchRequest(relative, tuple(args), code_dir, sync, nodes, nproc_per_node,
                            env, image, output_name, module, debug)
    return sbatch_script(inventory, request), note


def _sync_every_node(session: Session, inventory: Inventory, root: Path,
                     files: Mapping[str, workdir.LocalFile], code_dir: str
                     ) -> FanoutResult[workdir.SyncResult]:
    """Every node's listing, then one round that sends each node what it lacks, the
    nodes that lack the same files sharing one tar."""
    ignored = workdir.IgnoreRules(root).ignored
    planned = session.map(inventory.hosts, lambda c: workdir.plan_for(
        c, files, code_dir, ignored=ignored))
    plans = {node: plan for node, (plan, needed) in planned.values.items() if needed}
    with workdir.tar_streams(root, {n: p.send for n, p in plans.items()},
                             sorted(files)) as tars:
        applied = session.map([h for h in inventory.hosts if h.name in plans],
                              lambda c: workdir.apply(c, code_dir, plans[c.host], tars[c.host]))
    failures = {**planned.failures, **applied.failures}
    return FanoutResult(planned.hosts, {n: workdir.result_of(plan) for n, (plan, _) in
                                        planned.values.items() if n not in failures}, failures)
