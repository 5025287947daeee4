"""A launch's readiness checks: doctor's checks that decide whether a job can start,
run in the shells that start it, with the sync's listing and Slurm's view riding along."""

from __future__ import annotations

from collections.abc import Sequence

from gpucluster import hostrange
from gpucluster.doctor.gpu_selection import GpuSelection
from gpucluster.doctor.model import REGISTRY, CheckResult, Status
from gpucluster.doctor.runner import run_doctor
from gpucluster.inventory import Inventory
from gpucluster.launch import outside_slurm, workdir
from gpucluster.launch.model import LaunchRequest
from gpucluster.remote.session import Session
from gpucluster.remote.waiting import WaitingShells
from gpucluster.reports import Section
from gpucluster.wording import WARNING

# Doctor's checks that decide whether a job can start: no job of ours still running,
# the GPUs the inventory promises answering, none held by a process, and the rendezvous
# port free on the head and reachable. The GPU checks read what gpu-processes reads: the
# probe is no larger for them. Without them a node whose driver had failed started its
# ranks, which died at CUDA's first call; under --recover that cost a whole attempt.
# ssh: a node that does not answer refuses the launch at once, named with doctor's remedy
# (else the sync's second connect waited its timeout again, then failed as "sync").
# peer-ports: a firewall open on the rendezvous port alone lets the job form and hangs it
# at its first collective, until NCCL's timeout (10 minutes) or gloo's (30); its port
# mesh runs beside the rest of the probe (0.1 s more for 3 nodes on the sandbox).
# path-mtu: the same, for jumbo frames the network between two nodes does not carry (its
# full-size segment crosses the mesh's connections).
# node-tools: a node without tar, gzip or GNU find failed the sync with tar's own line
# ("gzip: Cannot exec"); the check names the package (a few builtins and three forks).
PREFLIGHT_CHECKS = ("ssh", "jobs", "nvidia-smi", "gpu-count", "gpu-processes",
                    "rendezvous-port", "peer-ports", "path-mtu", "node-tools")
# Warnings that do not refuse a start: a slow login only slows it; GPU counts that
# differ between nodes the inventory gives no count for are --nproc-per-node's business.
# ssh-mesh (launch -d only): a node that cannot log in to the others cannot stop the job
# on them when it fails there (its stop-peers.sh); the job itself runs without it.
STARTS_DESPITE_WARNING = ("ssh", "gpu-count", "ssh-mesh")
DETACHED_CHECKS = ("ssh-mesh",)
# Outside a container torchrun is the node's own: a node without it would end the job
# on every node with exit code 127; the check refuses first, naming cluster.torchrun.
# torch-build: a CPU build of torch on GPU nodes failed every rank at its first CUDA
# call; read from torch's version.py, it costs no import (the sandbox: 0.02 s a node).
HOST_PREFLIGHT_CHECKS = (*PREFLIGHT_CHECKS, "torchrun", "torch-build")


def checks_for(request: LaunchRequest) -> tuple[str, ...]:
    """A container job's torchrun and torch are the image's; a detached job's nodes stop
    it on the others themselves, over SSH."""
    checks = PREFLIGHT_CHECKS if request.image else HOST_PREFLIGHT_CHECKS
    return checks + (DETACHED_CHECKS if request.nodes_stop_at_once else ())


def preflight(session: Session, inventory: Inventory, shells: WaitingShells, code_dir: str,
              checks: tuple[str, ...] = PREFLIGHT_CHECKS, gpus: GpuSelection | None = None
              ) -> tuple[tuple[CheckResult, ...], dict[str, dict[str, Section]]]:
    """Doctor's job-readiness checks, and in the same round trip Slurm's view of the node
    (outside_slurm) and each node's listing of its copy of the work dir (for the sync),
    run in the shells that start the job next; the GPU checks on the job's `gpus`.
    Everything not OK or SKIP refuses the launch (`refusing`), but
    STARTS_DESPITE_WARNING's warnings."""
    report = run_doctor(session, inventory, [REGISTRY[name] for name in checks],
                        rider=outside_slurm.rider() + workdir.listing_command(code_dir),
                        probe_via=shells.step, gpus=gpus)
    return report.results, report.sections


def refusing(results: Sequence[CheckResult]) -> list[CheckResult]:
    """The findings that refuse a start: all but OK, SKIP and STARTS_DESPITE_WARNING's."""
    return [r for r in results if r.status not in (Status.OK, Status.SKIP)
            and not (r.name in STARTS_DESPITE_WARNING and r.status is Status.WARN)]


def mesh_warning(results: Sequence[CheckResult]) -> str | None:
    """launch -d's line for nodes that cannot log in to the next one: where the job fails
    on such a node, its ranks elsewhere wait on it until NCCL's timeout."""
    failed = [r for r in results if r.name == "ssh-mesh" and r.status is Status.WARN]
    if not failed:
        return None
    first = failed[0]
    others = "; gpucluster doctor --only ssh-mesh names each" if len(failed) > 1 else ""
    return (f"{WARNING}{hostrange.fold([r.host for r in failed])} cannot log in to the "
            f"next node over SSH ({first.host} to {first.details.get('peer')}: "
            f"{first.details.get('why')}{others}): where the job fails on such a node, it "
            f"is not stopped on the others, whose ranks wait until NCCL's timeout (10 "
            f"minutes) or gpucluster stop (fix: gpucluster provision --only ssh-mesh)")
