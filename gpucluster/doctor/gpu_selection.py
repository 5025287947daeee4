"""The GPUs a job uses on each node where it is not all of them: `launch --gpus 4-7`, or
CUDA_VISIBLE_DEVICES in the job's environment (the inventory's `env`, `-e`). CUDA
numbers the GPUs a process sees from 0 in the order listed, so local rank 0 runs on the
first of them. The checks before a start judge these GPUs only: a process on another
GPU of the node, or a sick GPU the job leaves out, does not refuse it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpucluster import hostrange
from gpucluster.doctor.nvidia_smi import Gpu, GpuProcess
from gpucluster.errors import GpuclusterError
from gpucluster.numerals import is_number, ranges

VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
MAX_INDEX = 1023  # far beyond any node's GPUs; bounds the list built from a range


@dataclass(frozen=True)
class GpuSelection:
    """CUDA_VISIBLE_DEVICES' entries: GPU indices, or UUIDs (`GPU-...`) as nvidia-smi -L
    prints them."""

    entries: tuple[str, ...]

    def selects(self, gpu: Gpu) -> bool:
        return self.holds(gpu.index, gpu.uuid)

    def holds(self, index: int | None, uuid: str | None) -> bool:
        """Whether the GPU of this index and UUID (either may be unknown) is chosen."""
        return any(_names(index, uuid, entry) for entry in self.entries)

    def chosen(self, gpus: Sequence[Gpu]) -> list[Gpu]:
        return [gpu for gpu in gpus if self.selects(gpu)]

    def missing(self, gpus: Sequence[Gpu]) -> list[str]:
        """The entries no GPU of a node's `gpus` answers to."""
        return [entry for entry in self.entries
                if not any(_names(g.index, g.uuid, entry) for g in gpus)]

    def on_chosen(self, processes: Sequence[GpuProcess], gpus: Sequence[Gpu]
                  ) -> list[GpuProcess]:
        """The `processes` on the chosen GPUs, by bus id; one whose GPU nvidia-smi does
        not name is kept (it may be on one of them)."""
        buses = {gpu.bus_id.upper() for gpu in self.chosen(gpus) if gpu.bus_id}
        return [p for p in processes if p.bus_id is None or p.bus_id.upper() in buses]

    def apart_from(self, other: str) -> bool:
        """No GPU in common with another job's CUDA_VISIBLE_DEVICES, `other`. Indices
        against UUIDs cannot be told apart here: they count as shared."""
        theirs = {entry.strip() for entry in other.split(",")}
        ours = set(self.entries)
        same_kind = {is_number(e) for e in ours | theirs} != {True, False}
        return same_kind and not ours & theirs

    @property
    def indices(self) -> str:
        """`4,5` for the scripts on the nodes, which compare index lists only; empty
        where the list names UUIDs."""
        return ",".join(self.entries) if self.first_index is not None else ""

    @property
    def option(self) -> str:
        """`--gpus 4-7 ` for a command on the same GPUs (reap's); empty where the list
        names UUIDs, which --gpus does not take."""
        if self.first_index is None:
            return ""
        return f"--gpus {hostrange.spans(sorted(int(entry) for entry in self.entries))} "

    @property
    def first_index(self) -> int | None:
        """The lowest GPU index listed; None where the list names UUIDs or nothing."""
        if not self.entries or not all(is_number(entry) for entry in self.entries):
            return None
        return min(int(entry) for entry in self.entries)

    def __str__(self) -> str:
        indices = [int(entry) for entry in self.entries if is_number(entry)]
        if len(indices) == len(self.entries) and indices == sorted(set(indices)):
            return f"GPU {hostrange.spans(indices)}"
        return f"GPUs {','.join(self.entries)}"


def _names(index: int | None, uuid: str | None, entry: str) -> bool:
    """CUDA's reading of one entry: an index, or a UUID or the start of one."""
    return entry == str(index) or (entry.startswith("GPU-") and uuid is not None
                                   and uuid.startswith(entry))


def from_env(env: Mapping[str, str]) -> GpuSelection | None:
    """The job's CUDA_VISIBLE_DEVICES as a selection; None where it is not set, or lists
    what is neither an index nor a GPU's UUID (a MIG device's: judged as before, the
    whole node)."""
    value = env.get(VISIBLE_DEVICES)
    if value is None:
        return None
    entries = tuple(entry.strip() for entry in value.split(","))
    if entries == ("",):
        return GpuSelection(())
    if not all(is_number(entry) or entry.startswith("GPU-") for entry in entries):
        return None
    return GpuSelection(entries)


def from_option(text: str) -> GpuSelection:
    """`--gpus 0-3,6` as a selection (doctor's, smoke's: what launch --gpus would use)."""
    return GpuSelection(tuple(parse_option(text).split(",")))


def parse_option(text: str, option: str = "--gpus") -> str:
    """`0-3,6` as CUDA_VISIBLE_DEVICES' value, `0,1,2,3,6`: indices from 0, single or as
    ranges, each once."""
    spans = ranges(text)
    if spans is None:
        raise GpuclusterError(f"{option} {text!r}: expected GPU indices from 0, single "
                              f"or as ranges (fix: e.g. {option} 4-7 or {option} 0,2)")
    if (last := max(high for _, high in spans)) > MAX_INDEX:
        raise GpuclusterError(f"{option} {text!r}: no node has GPU {last} (fix: give "
                              f"indices as nvidia-smi lists them, e.g. {option} 0-3)")
    indices = [index for low, high in spans for index in range(low, high + 1)]
    twice = sorted({i for i in indices if indices.count(i) > 1})
    if twice:
        raise GpuclusterError(f"{option} {text!r}: GPU {hostrange.spans(twice)} listed "
                              f"twice; two ranks on one GPU fail (NCCL: duplicate GPU) "
                              f"(fix: list each GPU once)")
    return ",".join(str(i) for i in indices)
