"""The simulated GPUs' load: which processes of the node use which GPU, and how busy
they keep it.

A process of this node (the same network namespace as nvidia-smi's) whose environment
says `LOCAL_RANK=k` is a torchrun worker, so a compute process on GPU k (the k-th of
CUDA_VISIBLE_DEVICES, where that lists the GPUs), with its
resident memory as the GPU memory it holds. GPU k's utilisation is the CPU its
processes used over the sample window (100% for one busy core), so it follows the
worker's real work. Processes registered in `<state>.apps` (planted by tests: foreign
users, leftovers) are reported too.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from gpucluster.procfs import gone

WINDOW_S = 0.2  # a one-shot query samples CPU use over this long, as NVML's window
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    gpu: int
    used_mib: int
    name: str


def _own_namespace() -> str:
    try:
        return str(Path("/proc/self/ns/net").readlink())
    except OSError:
        return ""


def _gpu_of(pid: str) -> int | None:
    """A worker's GPU: its LOCAL_RANK-th of those CUDA_VISIBLE_DEVICES lists, as CUDA
    numbers them (launch --gpus 4-7: local rank 0 is on GPU 4), else of all."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    variables = dict(entry.partition(b"=")[::2] for entry in environ.split(b"\0"))
    rank = variables.get(b"LOCAL_RANK", b"")
    if not rank.isdigit():
        return None
    visible = variables.get(b"CUDA_VISIBLE_DEVICES")
    if visible is None:
        return int(rank)
    listed = [entry.strip() for entry in visible.split(b",")]
    index = int(rank)
    return int(listed[index]) if index < len(listed) and listed[index].isdigit() else None


def _name(pid: str) -> str:
    try:
        return str(Path(f"/proc/{pid}/exe").readlink())
    except OSError:
        try:
            return Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            return "?"


def _resident_mib(pid: int) -> int:
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return pages * _PAGE // (1024 * 1024)


def cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime


def workers(count: int) -> list[GpuProcess]:
    """This node's processes with LOCAL_RANK below the GPU count."""
    namespace = _own_namespace()
    found = []
    for pid in (p.name for p in Path("/proc").iterdir() if p.name.isdigit()):
        try:
            if str(Path(f"/proc/{pid}/ns/net").readlink()) != namespace:
                continue
        except OSError:
            continue  # gone, or another user's
        gpu = _gpu_of(pid)
        if gpu is not None and gpu < count:
            found.append(GpuProcess(int(pid), gpu, _resident_mib(int(pid)), _name(pid)))
    return found


def planted(apps_file: Path, count: int) -> list[GpuProcess]:
    """`pid gpu_index used_mib name` lines of processes still alive. A zombie is not: the
    driver frees a process's GPU memory as it exits, before its parent reaps it."""
    if not apps_file.is_file():
        return []
    found = []
    for line in apps_file.read_text().splitlines():
        parts = line.split(maxsplit=3)
        if len(parts) == 4 and all(p.isdigit() for p in parts[:3]):
            pid, index, mib = (int(p) for p in parts[:3])
            if not gone(pid) and index < count:
                found.append(GpuProcess(pid, index, mib, parts[3]))
    return found


class Load:
    """GPU utilisation from the CPU use of each GPU's processes between two looks;
    kept across the samples of a streaming query (`-l`/`-lms`)."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[float, float]] = {}  # pid -> (wall, cpu seconds)

    def utilisation(self, processes: list[GpuProcess], count: int) -> list[int]:
        if processes and not self._seen:
            self._look(processes)
            time.sleep(WINDOW_S)
        per_gpu = [0.0] * count
        previous = self._seen
        self._seen = self._look(processes)
        for process in processes:
            before, now = previous.get(process.pid), self._seen.get(process.pid)
            if before and now and now[0] > before[0]:
                per_gpu[process.gpu] += (now[1] - before[1]) / (now[0] - before[0])
        return [min(100, round(100 * share)) for share in per_gpu]

    def _look(self, processes: list[GpuProcess]) -> dict[int, tuple[float, float]]:
        looked = {}
        for process in processes:
            used = cpu_seconds(process.pid)
            if used is not None:
                looked[process.pid] = (time.monotonic(), used)
        self._seen = looked
        return looked

