"""Slurm's jobs beside gpucluster's own: `jobs` lists Slurm's queue, and `logs` and
`stop` take a Slurm job as `slurm-ID` (the name of its output file, slurm-ID.out). Each
is asked on the Slurm controller host, in one short command."""

from __future__ import annotations

import re
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from gpucluster.errors import GpuclusterError
from gpucluster.inventory import Inventory
from gpucluster.remote.result import RemoteError
from gpucluster.remote.session import Session
from gpucluster.slurm.follow import JobInfo, job_info, unknown_job
from gpucluster.slurm.submit import submit_host
from gpucluster.slurm_states import ENDED_JOB_STATES, NOT_SET_UP, where_set_up
from gpucluster.state import state_dir_for

PREFIX = "slurm-"
JOB_NUMBER = re.compile(r"[1-9][0-9]*")
QUERY_TIMEOUT_S = 30.0
# %A, not %i: an array task's own job id (what its SLURM_JOB_ID, our slurm-ID names and its
# job dir say), where %i would print 12_3.
SQUEUE = "squeue -h -o '%A|%j|%u|%T|%M|%D|%R'"
# With the jobs that ended, for as long as slurmctld keeps them (MinJobAge, 300 s by
# default): how a job that just failed still shows in `jobs`.
SQUEUE_WITH_ENDED = f"{SQUEUE} -t all"
CANCEL_WAIT_S = 60.0  # Slurm ends the job's steps, then runs the epilog on its nodes


def slurm_job(reference: str | None) -> str | None:
    """`slurm-12` -> "12"; None for a reference to one of gpucluster's own jobs (their
    ids begin with a date, so no prefix or suffix of one starts with `slurm-`)."""
    if reference is None or not reference.lower().startswith(PREFIX):
        return None
    number = reference[len(PREFIX):]
    # From 1, in ASCII digits: `scontrol show job 0` lists every job, and "007" or "١٢"
    # name none.
    if not JOB_NUMBER.fullmatch(number):
        raise GpuclusterError(f"{reference}: a Slurm job is slurm-ID, ID its number "
                              f"(fix: e.g. slurm-12; gpucluster jobs lists them)")
    return number


def kept_munge_key(state_dir: Path) -> Path:
    """Where provision --with slurm keeps the cluster's munge key, beside the cluster key.
    While it is there, Slurm is set up from here; `--undo slurm` removes it."""
    return state_dir / "slurm" / "munge.key"


def enabled_in(inventory: Inventory) -> bool:
    """The inventory's `slurm:` section enables Slurm (a sandbox's `enabled: false` one
    does not): every provision then includes the step."""
    return inventory.slurm is not None and inventory.slurm.enabled


def set_up_from_here(inventory: Inventory) -> bool:
    """Worth asking Slurm: the inventory enables it, or provision --with slurm made the
    cluster's munge key beside it."""
    return enabled_in(inventory) or kept_munge_key(state_dir_for(inventory)).exists()


@dataclass(frozen=True)
class QueuedJob:
    id: str
    name: str
    user: str
    state: str  # RUNNING, PENDING...
    elapsed: str  # as squeue writes it: 1:05, 2-03:00:00
    nodes: int
    where: str  # its nodes once running; while pending, why it waits: (Resources)

    @property
    def ended(self) -> bool:
        return self.state in ENDED_JOB_STATES


def parse_squeue(text: str) -> list[QueuedJob]:
    jobs = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 7 and parts[0] and parts[5].isdigit():
            jobs.append(QueuedJob(parts[0], parts[1], parts[2], parts[3], parts[4],
                                  int(parts[5]), parts[6]))
    return jobs


def queue(session: Session, inventory: Inventory,
          with_ended: bool = False) -> list[QueuedJob] | None:
    """Every job in Slurm's queue (`with_ended`: and those that ended, while Slurm keeps
    them), from the controller host; None where Slurm is not set up there. A squeue that
    fails is an error naming the host and squeue's words."""
    host = submit_host(inventory)
    command = SQUEUE_WITH_ENDED if with_ended else SQUEUE
    try:
        result = session.connection(host).run(where_set_up(command), QUERY_TIMEOUT_S)
    except RemoteError as error:
        raise GpuclusterError(f"{host.name}: Slurm's queue could not be read: "
                              f"{error.message}") from None
    if result.ok and result.stdout.strip() == NOT_SET_UP:
        return None
    if not result.ok:
        raise GpuclusterError(f"{host.name}: squeue failed: {result.last_word} (fix: is slurmctld "
                              f"running? gpucluster provision --with slurm starts it)")
    return parse_squeue(result.stdout)


def cancel(session: Session, inventory: Inventory, job_id: str,
           wait_s: float = CANCEL_WAIT_S) -> tuple[JobInfo, bool]:
    """scancel on the controller host, then wait for Slurm to call the job ended (its
    processes gone, its epilog run): the job as Slurm last showed it, and whether it had
    ended before (nothing was cancelled)."""
    host = submit_host(inventory)
    connection = session.connection(host)
    before = job_info(connection, job_id)
    if isinstance(before, JobInfo) and before.state == "":
        raise unknown_job(job_id, "fix: gpucluster jobs lists Slurm's queue")
    if isinstance(before, JobInfo) and before.ended:
        return before, True
    try:
        done = connection.run(f"scancel {shlex.quote(job_id)}", QUERY_TIMEOUT_S)
    except RemoteError as error:
        raise GpuclusterError(f"{host.name}: Slurm job {job_id} was not cancelled: "
                              f"{error.message}") from None
    if not done.ok:
        raise GpuclusterError(f"{host.name}: scancel {job_id} failed: {done.last_word}")
    deadline = time.monotonic() + wait_s
    while True:
        info = job_info(connection, job_id)
        if isinstance(info, JobInfo) and (info.ended or time.monotonic() >= deadline):
            return info, False  # ended, or still ending when the wait ran out
        if time.monotonic() >= deadline:
            raise GpuclusterError(f"{host.name}: Slurm job {job_id} was cancelled, but "
                                  f"scontrol did not answer for {wait_s:g} s: {info} "
                                  f"(squeue -j {job_id} on a node shows where it is)")
        time.sleep(0.5)
