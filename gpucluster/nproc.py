"""How many processes torchrun starts on a node: one per GPU. Shared by launch, the smoke
test and export sbatch."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpucluster import hostrange
from gpucluster.errors import GpuclusterError
from gpucluster.inventory import Host, Inventory
from gpucluster.numerals import is_number
from gpucluster.wording import counted


def count_gpus(visible: Sequence[str] | None = None) -> str:
    """A command counting a node's GPUs and those of them in MIG mode, for the round trip
    that already goes there: "8 0" (a wedged driver hangs nvidia-smi, hence the limit; no
    driver: "0 0"). With `visible` (a job's CUDA_VISIBLE_DEVICES entries: indices, UUIDs
    or their starts, as CUDA reads them), those GPUs only: nvidia-smi lists every one."""
    if visible is not None and not visible:
        return "echo 0 0"  # CUDA_VISIBLE_DEVICES="": CUDA sees no GPU
    wanted = shlex.quote(",".join(visible or ()))
    return ("{ timeout 20 nvidia-smi --query-gpu=index,uuid,mig.mode.current --format=csv,"
            f"noheader 2>/dev/null || :; }} | awk -F', *' -v visible={wanted} "
            "'BEGIN { n = split(visible, want, \",\") } /^[0-9]+,/ { "
            "for (i = 1; i <= n; i++) if (want[i] == $1 || (want[i] ~ /^GPU-/ && "
            "index($2, want[i]) == 1)) break; if (n && i > n) next; gpus++; "
            "if ($3 ~ /^Enabled/) mig++ } END { print gpus + 0, mig + 0 }'")


@dataclass(frozen=True)
class GpuCount:
    gpus: int
    mig: int  # of them in MIG mode


def counted_gpus(output: str) -> GpuCount | None:
    """The counts COUNT_GPUS printed as the last line of `output`, if it did."""
    words = output.strip().rpartition("\n")[2].split()
    if len(words) != 2 or not all(is_number(word) for word in words):
        return None
    return GpuCount(int(words[0]), int(words[1]))


def known_gpus(host: Host, found: int | None = None, chosen: bool = False) -> int:
    """The GPUs a node's jobs use: the inventory's `gpus`, else those `found` on it (or
    only those, where the job `chosen` some: launch --gpus); 0 where jobs run on the CPU
    or none is known."""
    if host.torch_device != "cuda":
        return 0
    return (found or 0) if chosen else host.gpus or found or 0


def nproc_for(host: Host, override: int | None, found: int | None = None,
              chosen: bool = False) -> int:
    """One process per GPU (known_gpus); 1 where it knows none."""
    return override if override is not None else known_gpus(host, found, chosen) or 1


def check_nproc(inventory: Inventory, nproc: int | None,
                found: Mapping[str, int] | None = None, chosen: bool = False) -> None:
    """More processes than a node has GPUs fail at start (an invalid device ordinal, or
    NCCL's "Duplicate GPU detected", in every extra rank) or share GPUs unasked: refused
    before anything starts. A node's GPUs: the inventory's `gpus`, else those `found`
    (those the job `chosen`, where it did)."""
    def gpus(host: Host) -> int:  # 0 (jobs on the CPU, or none known): as many as asked
        return known_gpus(host, (found or {}).get(host.name), chosen)
    over = [h for h in inventory.hosts if nproc is not None and gpus(h) and nproc > gpus(h)]
    if over:
        fewest = min(gpus(h) for h in over)
        whose = ("the job's: --gpus or CUDA_VISIBLE_DEVICES" if chosen
                 else "the inventory's gpus" if all(h.gpus for h in over) else "found there")
        more = {"the inventory's gpus": ", or correct gpus: in the inventory",
                "found there": ""}.get(whose, ", or give the job more GPUs")
        raise GpuclusterError(
            f"--nproc-per-node {nproc}: {hostrange.fold([h.name for h in over])} "
            f"{'has' if len(over) == 1 else 'have'} {counted(fewest, 'GPU')} ({whose}) "
            f"(fix: --nproc-per-node {fewest} or fewer, one process per GPU"
            f"{more})")


def check_mig(inventory: Inventory, nproc: int | None, found: Mapping[str, int],
              mig: Mapping[str, int], chosen: bool = False) -> None:
    """CUDA gives a process one MIG device, whatever the node has: where a node's GPUs
    are in MIG mode (`mig`: their count per node), a second process of a job on the GPUs
    would find none of its own (CUDA's invalid device ordinal, or NCCL's duplicate GPU),
    so that is refused before anything starts. One process per node runs on one."""
    processes = {h.name: nproc_for(h, nproc, found.get(h.name), chosen) for h in inventory.hosts
                 if mig.get(h.name) and h.torch_device == "cuda"}
    over = [node for node, count in processes.items() if count > 1]
    if not over:
        return
    most = max(processes[node] for node in over)
    raise GpuclusterError(
        f"{hostrange.fold(over)}: "
        f"{counted(max(mig[node] for node in over), 'GPU')} in MIG mode, where CUDA gives a "
        f"process one MIG device: of {most} processes a node, {most - 1} would find no GPU "
        f"(fix: to train on whole GPUs, turn MIG off there: sudo nvidia-smi -mig 0, then "
        f"reset the GPUs, as `gpucluster doctor --only mig` says; or --nproc-per-node 1, "
        f"one process a node on one MIG device)")


def check_fit(inventory: Inventory, nproc: int | None,
              counts: Mapping[str, GpuCount], chosen: bool = False) -> dict[str, int]:
    """check_nproc and check_mig on the GPUs a node's nvidia-smi `counts` (where the
    inventory gives no `gpus`, or the job `chosen` some: those); the GPUs found per
    node."""
    found = {node: count.gpus for node, count in counts.items()}
    check_nproc(inventory, nproc, found, chosen)
    check_mig(inventory, nproc, found, {node: count.mig for node, count in counts.items()},
              chosen)
    return found
