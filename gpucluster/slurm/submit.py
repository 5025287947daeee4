"""`export sbatch --submit`: hand the batch script to sbatch on the Slurm controller
host, from the nodes' copy of the work dir, so the job's output lands beside its code."""

from __future__ import annotations

from dataclasses import dataclass

from gpucluster.errors import GpuclusterError
from gpucluster.inventory import Host, Inventory
from gpucluster.remote.result import CommandResult, RemoteError
from gpucluster.remote.session import Session
from gpucluster.slurm.config import controller_name

SUBMIT_TIMEOUT_S = 60
# Exit codes of the submit command that are ours, not sbatch's.
NO_WORK_DIR, NO_SBATCH = 90, 91
# What sbatch says when there is no slurmctld to take the job.
SLURM_DOWN = ("Could not establish a configuration source", "Unable to contact slurm controller")


@dataclass(frozen=True)
class Submitted:
    job_id: str
    host: str  # where it was submitted
    output: str  # Slurm's default output file, on the node that runs the batch step


def submit_host(inventory: Inventory) -> Host:
    """The slurmctld host, as provision set it up."""
    return inventory.host(controller_name(inventory.slurm, inventory))


def submit_command(code_dir: str) -> str:
    """sbatch reads the script on stdin: nothing is written on the node, and the submit
    directory (where `slurm-<id>.out` goes) is the work dir."""
    return (f"cd {code_dir} 2>/dev/null || exit {NO_WORK_DIR}; "
            f"command -v sbatch >/dev/null || exit {NO_SBATCH}; sbatch --parsable")


def refusal(result: CommandResult) -> str:
    """sbatch's last word, and the fix where Slurm itself is not answering."""
    said = result.last_word
    if any(sign in result.stderr for sign in SLURM_DOWN):
        said += " (fix: is Slurm set up and running? gpucluster provision --with slurm)"
    return said


def submit(session: Session, inventory: Inventory, script: str, code_dir: str,
           shown_dir: str) -> Submitted:
    """`code_dir`: the nodes' copy of the work dir, shell-quoted; `shown_dir`: the same as
    the user wrote it (`~/gpucluster/proj`), for messages."""
    host = submit_host(inventory)
    try:
        result = session.connection(host).run(submit_command(code_dir), SUBMIT_TIMEOUT_S,
                                              stdin=script.encode())
    except RemoteError as error:
        raise GpuclusterError(f"{host.name}: the job was not submitted: {error.message}"
                              ) from None
    if result.exit_code == NO_WORK_DIR:
        raise GpuclusterError(f"{host.name}: no {shown_dir} there, so nothing was submitted "
                              f"(fix: drop --no-sync, or put the work dir there)")
    if result.exit_code == NO_SBATCH:
        raise GpuclusterError(f"{host.name} has no sbatch, so nothing was submitted (fix: "
                              f"gpucluster provision --with slurm)")
    job_id = result.stdout.strip().split(";", 1)[0]
    if not result.ok or not job_id.isdigit():
        raise GpuclusterError(f"{host.name}: sbatch refused the job: {refusal(result)}")
    return Submitted(job_id, host.name, f"{shown_dir}/slurm-{job_id}.out")
