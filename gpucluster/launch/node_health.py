"""Where the next attempt of `launch --recover` may run: doctor's health checks on the
nodes, the spares that pass them, and the run's checkpoints copied to a spare that joins."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Collection

from gpucluster.doctor.model import REGISTRY, Status
from gpucluster.doctor.runner import run_doctor
from gpucluster.inventory import Host, Inventory
from gpucluster.launch.node_scripts import CHECKPOINT_COPY_S
from gpucluster.remote.session import Session

# What a node must pass to rejoin: reachable, its GPUs there and healthy (their clocks
# too: a GPU the hardware slows would set the whole job's pace), nothing holding them,
# and NCCL's and gloo's ports open to it (else the next start refuses it: the run ends).
HEALTH_CHECKS = ("ssh", "nvidia-smi", "gpu-count", "ecc", "xid", "clocks", "gpu-processes",
                 "jobs", "peer-ports")
# Before the first attempt, a node is set aside only for what a spare can make up for: a
# job or a process on its GPUs is the user's to end (the refusal says how), not a reason
# to start on fewer nodes.
START_HEALTH_CHECKS = ("ssh", "nvidia-smi", "gpu-count", "ecc", "xid", "peer-ports")


def health_findings(session: Session, nodes: Inventory,
                    checks: tuple[str, ...] = HEALTH_CHECKS,
                    judged: Collection[str] | None = None) -> dict[str, str]:
    """Doctor's health checks on every node of `nodes`; those of them (or of `judged`)
    that fail them, with the first reason."""
    report = run_doctor(session, nodes, [REGISTRY[name] for name in checks])
    judged = {h.name for h in nodes.hosts} if judged is None else judged
    sick: dict[str, str] = {}
    for found in report.results:
        if found.status is Status.FAIL and found.host in judged:
            sick.setdefault(found.host, f"{found.name}: {found.message}")
    return sick


def take_spares(session: Session, inventory: Inventory, spares: list[Host], needed: int,
                say: Callable[[str], None], staying: list[Host]) -> list[Host]:
    """Up to `needed` spares that pass the health checks, taken out of `spares`. Each is
    checked beside the nodes it would join (`staying`), whose ports it must reach and
    which must reach its own, and judged alone."""
    joined: list[Host] = []
    while spares and len(joined) < needed:
        spare = spares.pop(0)
        sick = health_findings(session, inventory.restricted_to(
            [h for h in inventory.hosts if h in staying or h is spare]), judged={spare.name})
        if sick:
            say(f"spare {spare.name} is not healthy either: {sick[spare.name]}")
            continue
        say(f"spare {spare.name} takes a lost node's place")
        joined.append(spare)
    return joined


def copy_checkpoints(session: Session, inventory: Inventory, checkpoint_dir: str,
                     source: Host, targets: list[Host], say: Callable[[str], None]) -> None:
    """The run's checkpoint dir from a node that has it to each joining node, node to
    node over the SSH mesh (provision's ssh-mesh), never through the controller."""
    for target in targets:
        unpack = f"mkdir -p {checkpoint_dir} && tar -C {checkpoint_dir} -xf -"
        command = (f"cd {checkpoint_dir} && tar -cf - . | ssh -o BatchMode=yes "
                   f"{shlex.quote(target.name)} {shlex.quote(unpack)}")
        done = session.connection(source).run(command, timeout=CHECKPOINT_COPY_S)
        if done.ok:
            say(f"copied the run's checkpoints from {source.name} to {target.name}")
        else:
            say(f"could not copy the checkpoints from {source.name} to {target.name} "
                f"({done.stderr.strip()[-200:] or f'exit {done.exit_code}'}): it starts "
                f"without them (fix: gpucluster provision --only ssh-mesh)")
