"""`gpucluster bundle slurm-ID`: a Slurm job's part of the bundle. Slurm's record of it
(`scontrol show job`, from the controller host) and the end of its output file (from the
node that ran its batch step); its nodes and start time choose what the rest collects."""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass

from gpucluster import hostrange
from gpucluster.errors import GpuclusterError, HostRangeError
from gpucluster.inventory import Inventory
from gpucluster.remote.result import RemoteError
from gpucluster.remote.session import Session
from gpucluster.slurm.follow import (
    FORGOTTEN,
    POLL_TIMEOUT_S,
    JobInfo,
    file_bytes,
    parse_job,
    unknown_job,
)
from gpucluster.slurm.submit import submit_host

MAX_OUTPUT_BYTES = 8 * 1024 * 1024  # the end of the output: where a failure shows
SUMMARY_LINES = 20


@dataclass(frozen=True)
class SlurmJob:
    id: str
    info: JobInfo
    shown: str  # scontrol show job, as Slurm writes it
    output: bytes  # the end of its StdOut file; empty where it could not be read
    output_note: str  # why the output is missing, if it is
    hosts: list[str]  # its nodes that are in the inventory (all of them while pending)
    started_at: float | None  # StartTime, once it has started

    @property
    def job_dir(self) -> str:
        """GPC_JOB_DIR of an exported batch script, relative to cluster.work_dir."""
        return f"jobs/slurm-{self.id}"

    def lines(self) -> list[str]:
        return self.output.decode(errors="replace").splitlines()


def read(session: Session, inventory: Inventory, job_id: str) -> SlurmJob:
    """Slurm's record of the job and the end of its output; a job Slurm does not know
    is an error with where its output stays."""
    controller = submit_host(inventory)
    try:
        shown = session.connection(controller).run(
            f"scontrol show job {shlex.quote(job_id)}", POLL_TIMEOUT_S)
    except RemoteError as error:
        raise GpuclusterError(f"{controller.name}: Slurm job {job_id} could not be read: "
                              f"{error.message}") from None
    if not shown.ok:
        if FORGOTTEN in shown.stderr:
            raise unknown_job(job_id, f"fix: bundle without a job; its output stays in "
                                      f"slurm-{job_id}.out where it was submitted")
        raise GpuclusterError(f"{controller.name}: scontrol show job {job_id} failed: "
                              f"{shown.last_word} (fix: is slurmctld running?)")
    info = parse_job(shown.stdout)
    names = {h.name for h in inventory.hosts}
    ran_on = [n for n in _expand(info.nodes) if n in names]
    output, note = _output(session, inventory, info)
    return SlurmJob(job_id, info, shown.stdout, output, note,
                    ran_on or [h.name for h in inventory.hosts], _start_time(shown.stdout))


def _expand(nodes: str) -> list[str]:
    if nodes in ("", "(null)"):
        return []
    try:
        return hostrange.expand_list(nodes)  # Slurm's hostlist: node[1-2],gpu07
    except HostRangeError:
        return []


def _output(session: Session, inventory: Inventory, info: JobInfo) -> tuple[bytes, str]:
    by_name = {h.name: h for h in inventory.hosts}
    host = by_name.get(info.batch_host)
    if not info.stdout or host is None:
        return b"", ("it has not started" if not info.batch_host else
                     f"its batch node {info.batch_host} is not in the inventory")
    try:
        return file_bytes(session, host, info.stdout, str(MAX_OUTPUT_BYTES)), ""
    except RemoteError as error:
        return b"", f"{host.name}: {error.message}"
    except GpuclusterError as error:
        return b"", str(error)


def _start_time(shown: str) -> float | None:
    """StartTime=2026-12-03T03:40:12, the controller's local time taken as ours (the
    kernel-log window opens ten minutes before it, which absorbs a small difference)."""
    for word in shown.split():
        key, _, value = word.partition("=")
        if key == "StartTime":
            try:
                return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))
            except ValueError:  # Unknown, while it waits
                return None
    return None
