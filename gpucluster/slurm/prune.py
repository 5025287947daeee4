"""`gpucluster prune`, for Slurm's jobs: a job from `export sbatch` leaves on each node its
GPC_JOB_DIR (`<work_dir>/jobs/slurm-ID`) and its checkpoints (`<work_dir>/checkpoints/
slurm-ID`), and no record here knows of it. Its files go once Slurm no longer has the job
(squeue, on the controller host) and nothing in them was written for longer than the
age asked: a listing round, then (with --yes) a removal round, on every node."""

from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import dataclass, field

from gpucluster import hostrange, reports
from gpucluster.errors import GpuclusterError
from gpucluster.inventory import Inventory
from gpucluster.launch.jobs import JobStore
from gpucluster.launch.prune import once_per_directory
from gpucluster.remote.connection import Connection, shell_path
from gpucluster.remote.session import Session
from gpucluster.slurm.queue import queue
from gpucluster.state import state_dir_for
from gpucluster.templating import render

LIST_TIMEOUT_S = 120.0
REMOVE_TIMEOUT_S = 300.0  # checkpoints: large, but bounded


@dataclass(frozen=True)
class SlurmFiles:
    """One job's files on one node, in bytes; None where the node has none."""

    job_bytes: int | None = None
    checkpoint_bytes: int | None = None
    job_dir: str = ""  # which directories (once_per_directory): shared homes share them
    checkpoint_dir: str = ""


@dataclass
class SlurmJobPrune:
    job_id: str
    last_written: float  # the newest file of its dirs, on any node
    remove_checkpoints: bool
    nodes: dict[str, SlurmFiles] = field(default_factory=dict)
    removed: bool = False
    problem: str = ""

    @property
    def job_bytes(self) -> int:
        return once_per_directory((f.job_dir, f.job_bytes) for f in self.nodes.values())

    @property
    def checkpoint_bytes(self) -> int:
        return once_per_directory((f.checkpoint_dir, f.checkpoint_bytes)
                                  for f in self.nodes.values())

    @property
    def node_bytes(self) -> int:
        return self.job_bytes + (self.checkpoint_bytes if self.remove_checkpoints else 0)


@dataclass
class SlurmPruneReport:
    jobs: list[SlurmJobPrune]
    skipped: list[tuple[str, str]]  # job id, why its files stay


def prune(session: Session, inventory: Inventory, older_than_s: float, checkpoints: bool,
          remove: bool, now: float | None = None) -> SlurmPruneReport:
    """Size (and with `remove`, delete) the files of every Slurm job that Slurm no longer
    has and that nothing wrote to for `older_than_s`. Nothing is removed when squeue
    cannot say which jobs Slurm has, or a node does not answer the listing."""
    work_dir = shell_path(inventory.cluster.work_dir)
    listed = session.map(inventory.hosts, lambda c: _listing(c, work_dir))
    found: dict[str, dict[str, SlurmFiles]] = {}
    newest: dict[str, float] = {}
    for node, entries in listed.values.items():
        for job_id, kind, kib, mtime, identity in entries:
            files = found.setdefault(job_id, {}).get(node, SlurmFiles())
            size = int(kib) * 1024 if kib.isdigit() else None
            found[job_id][node] = (
                dataclasses.replace(files, job_bytes=size, job_dir=identity)
                if kind == "jobs" else
                dataclasses.replace(files, checkpoint_bytes=size, checkpoint_dir=identity))
            newest[job_id] = max(newest.get(job_id, 0.0), float(mtime or 0))
    cutoff = (now if now is not None else time.time()) - older_than_s
    old = sorted((job_id for job_id in found if newest[job_id] <= cutoff), key=int)
    if not old:
        return SlurmPruneReport([], [])
    skipped: list[tuple[str, str]] = []
    try:
        active = {job.id: job.state.lower() for job in queue(session, inventory) or []}
    except GpuclusterError as error:
        return SlurmPruneReport([], [(job_id, f"Slurm's queue could not be read: {error}")
                                     for job_id in old])
    jobs = []
    for job_id in old:
        if job_id in active:
            skipped.append((job_id, f"Slurm still has it ({active[job_id]})"))
        elif listed.failures:
            skipped.append((job_id, f"{hostrange.fold(sorted(listed.failures))} did not "
                                    f"answer: its files there are unknown"))
        else:
            jobs.append(SlurmJobPrune(job_id, newest[job_id], checkpoints, found[job_id]))
    if remove and jobs:
        _remove(session, inventory, work_dir, jobs, checkpoints)
    return SlurmPruneReport(jobs, skipped)


def _listing(connection: Connection, work_dir: str) -> list[tuple[str, str, str, str, str]]:
    script = render("slurm/prune.sh.j2", node=connection.host, remove=[],
                    work_dir=work_dir, checkpoints=False)
    done = connection.run(script, timeout=LIST_TIMEOUT_S)
    if not done.ok:
        raise GpuclusterError(done.stderr.strip()[-200:] or done.ending)
    entries = []
    for line in reports.by_kind(done.stdout).get("slurm-files", []):
        fields = line.split()
        if len(fields) == 5 and fields[0].isdigit():
            job_id, kind, kib, mtime, identity = fields
            entries.append((job_id, kind, kib, mtime if mtime.isdigit() else "0",
                            "" if identity == "-" else identity))
    return entries


def _remove(session: Session, inventory: Inventory, work_dir: str,
            jobs: list[SlurmJobPrune], checkpoints: bool) -> None:
    by_node = {h.name: [j.job_id for j in jobs if h.name in j.nodes] for h in inventory.hosts}
    wanted = [h for h in inventory.hosts if by_node[h.name]]

    def run(connection: Connection) -> None:
        script = render("slurm/prune.sh.j2", node=connection.host,
                        remove=by_node[connection.host], work_dir=work_dir,
                        checkpoints=checkpoints)
        done = connection.run(script, timeout=REMOVE_TIMEOUT_S)
        if not done.ok:
            raise GpuclusterError(f"removing failed ({done.ending}): "
                                  f"{done.stderr.strip()[-200:]}")

    done = session.map(wanted, run)
    here = JobStore(state_dir_for(inventory))
    for job in jobs:
        failed = [n for n in job.nodes if n in done.failures]
        if failed:
            job.problem = f"{failed[0]}: {done.failures[failed[0]].message}"
        else:
            job.removed = True
            # what was kept here of it: `gpucluster stacks slurm-ID`'s looks
            shutil.rmtree(here.directory(f"slurm-{job.job_id}"), ignore_errors=True)

