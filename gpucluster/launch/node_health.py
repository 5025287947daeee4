"""Where the next attempt of `launch --recover` may run: doctor's health checks on the
nodes, the spares that pass them, and the run's checkpoints copied to a spare that joins."""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Callable, Collection, Mapping

from gpucluster.doctor.gpu_selection import GpuSelection
from gpucluster.doctor.model import REGISTRY, CheckResult, Status
from gpucluster.doctor.runner import run_doctor
from gpucluster.inventory import Host, Inventory
from gpucluster.launch.node_scripts import CHECKPOINT_COPY_S
from gpucluster.remote.session import Session

# What a node must pass to rejoin: reachable, its GPUs there and healthy (their clocks
# too: a GPU the hardware slows would set the whole job's pace), nothing holding them,
# NCCL's and gloo's ports open to it and full-size packets crossing to and from it (else
# the next start refuses it: the run ends).
HEALTH_CHECKS = ("ssh", "nvidia-smi", "gpu-count", "ecc", "xid", "clocks", "gpu-processes",
                 "jobs", "peer-ports", "path-mtu")
# Before the first attempt, a node is set aside only for what a spare can make up for: a
# job or a process on its GPUs is the user's to end (the refusal says how), not a reason
# to start on fewer nodes.
START_HEALTH_CHECKS = ("ssh", "nvidia-smi", "gpu-count", "ecc", "xid", "peer-ports",
                       "path-mtu")


def health_findings(session: Session, nodes: Inventory,
                    checks: tuple[str, ...] = HEALTH_CHECKS,
                    judged: Collection[str] | None = None,
                    gpus: GpuSelection | None = None) -> dict[str, str]:
    """Doctor's health checks on every node of `nodes` (their GPU checks on the job's
    `gpus`); those of them (or of `judged`) that fail them, with the first reason."""
    report = run_doctor(session, nodes, [REGISTRY[name] for name in checks], gpus=gpus)
    judged = {h.name for h in nodes.hosts} if judged is None else judged
    sick: dict[str, str] = {}
    lossy: dict[str, CheckResult] = {}  # path-mtu's: judged by pairs, below
    for found in report.results:
        if found.status is not Status.FAIL:
            continue
        if found.name == "path-mtu":
            lossy[found.host] = found
        elif found.host in judged:
            sick.setdefault(found.host, f"{found.name}: {found.message}")
    order = [h.name for h in nodes.hosts]
    for node in fewest_to_part(lossy, set(sick), judged, order):
        sick.setdefault(node, f"path-mtu: {lossy[node].message}")
    return sick


def fewest_to_part(lossy: Mapping[str, CheckResult], gone: Collection[str],
                   judged: Collection[str], order: list[str]) -> list[str]:
    """Of the `judged` nodes, the fewest to set aside so that no pair between which
    path-mtu found full-size packets lost (`lossy`: its FAILs) is left, besides the nodes
    `gone` already: a pair is mended by either node going. One node with jumbo frames
    among many makes a pair with each: it goes alone. First the node in most pairs; on a
    tie, the later in the inventory (the head stays)."""
    pairs = {frozenset((node, source)) for node, found in lossy.items()
             for source in found.details.get("stalled_from", {}) if source != node}
    pairs = {pair for pair in pairs if not pair & set(gone)}
    chosen: list[str] = []
    while pairs:
        counts = Counter(node for pair in pairs for node in pair if node in judged)
        if not counts:
            break  # the pairs left are between nodes not judged here
        node = max(counts, key=lambda n: (counts[n], order.index(n) if n in order else -1))
        chosen.append(node)
        pairs = {pair for pair in pairs if node not in pair}
    return chosen


def take_spares(session: Session, inventory: Inventory, spares: list[Host], needed: int,
                say: Callable[[str], None], staying: list[Host],
                gpus: GpuSelection | None = None) -> list[Host]:
    """Up to `needed` spares that pass the health checks, taken out of `spares`. Each is
    checked beside the nodes it would join (`staying`), whose ports it must reach and
    which must reach its own, and judged alone."""
    joined: list[Host] = []
    while spares and len(joined) < needed:
        spare = spares.pop(0)
        sick = health_findings(session, inventory.restricted_to(
            [h for h in inventory.hosts if h in staying or h is spare]), judged={spare.name},
            gpus=gpus)
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
