"""How many processes torchrun starts on a node: one per GPU. Shared by launch, the smoke
test and export sbatch."""

from __future__ import annotations

from collections.abc import Mapping

from gpucluster import hostrange
from gpucluster.errors import GpuclusterError
from gpucluster.inventory import Host, Inventory
from gpucluster.numerals import is_number
from gpucluster.wording import counted

# A node's GPUs, counted in the round trip that already goes there (a wedged driver hangs
# nvidia-smi, hence the limit; no driver: 0). MIG devices are indented lines: not counted.
COUNT_GPUS = "{ timeout 20 nvidia-smi -L 2>/dev/null || :; } | grep -c '^GPU ' || :"


def counted_gpus(output: str) -> int | None:
    """The count COUNT_GPUS printed as the last line of `output`, if it did."""
    last = output.strip().rpartition("\n")[2]
    return int(last) if is_number(last) else None


def known_gpus(host: Host, found: int | None = None) -> int:
    """The GPUs a node's jobs use: the inventory's `gpus`, else those `found` on it; 0
    where jobs run on the CPU or none is known."""
    if host.torch_device != "cuda":
        return 0
    return host.gpus or found or 0


def nproc_for(host: Host, override: int | None, found: int | None = None) -> int:
    """One process per GPU (known_gpus); 1 where it knows none."""
    return override if override is not None else known_gpus(host, found) or 1


def check_nproc(inventory: Inventory, nproc: int | None,
                found: Mapping[str, int] | None = None) -> None:
    """More processes than a node has GPUs fail at start (an invalid device ordinal, or
    NCCL's "Duplicate GPU detected", in every extra rank) or share GPUs unasked: refused
    before anything starts. A node's GPUs: the inventory's `gpus`, else those `found`."""
    def gpus(host: Host) -> int:  # 0 (jobs on the CPU, or none known): as many as asked
        return known_gpus(host, (found or {}).get(host.name))
    over = [h for h in inventory.hosts if nproc is not None and gpus(h) and nproc > gpus(h)]
    if over:
        fewest = min(gpus(h) for h in over)
        whose = "the inventory's gpus" if all(h.gpus for h in over) else "found there"
        raise GpuclusterError(
            f"--nproc-per-node {nproc}: {hostrange.fold([h.name for h in over])} "
            f"{'has' if len(over) == 1 else 'have'} {counted(fewest, 'GPU')} ({whose}) "
            f"(fix: --nproc-per-node {fewest} or fewer, one process per GPU"
            + (", or correct gpus: in the inventory)" if whose.startswith("the") else ")"))
