"""Shared by the benchmarks: a sandbox of their own, timing, and ratio printing.

Benchmarks print figures; they never assert timings (those are noisy on 2 cores).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
GPUCLUSTER = [sys.executable, "-m", "gpucluster"]


@contextmanager
def sandbox(name: str, subnet: str, nodes: int, workdir: Path,
            extra: tuple[str, ...] = ()) -> Iterator[dict]:
    """A sandbox just for this benchmark; always taken down, even on Ctrl-C."""
    inventory = workdir / f"{name}.yaml"
    subprocess.run([*GPUCLUSTER, "sandbox", "down", "--name", name], capture_output=True,
                   check=False)
    subprocess.run([*GPUCLUSTER, "sandbox", "up", "--name", name, "--subnet", subnet,
                    "--nodes", str(nodes), "--write-inventory", str(inventory), *extra],
                   check=True, capture_output=True)
    try:
        data = yaml.safe_load(inventory.read_text())
        data["path"] = str(inventory)
        yield data
    finally:
        subprocess.run([*GPUCLUSTER, "sandbox", "down", "--name", name], capture_output=True,
                       check=False)


def timed(argv: list[str], check: Callable[[subprocess.CompletedProcess[str]], None],
          env: dict[str, str] | None = None) -> float:
    """Wall time of one run of `argv`; `check` rejects a run that did not do the work."""
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    elapsed = time.perf_counter() - started
    check(done)
    return elapsed


def median_of(runs: list[float]) -> float:
    return statistics.median(runs)


def print_table(title: str, rows: list[tuple[str, float]], baseline: str) -> None:
    base = dict(rows)[baseline]
    print(f"\n{title}")
    print(f"{'tool':<34} {'median s':>9} {'vs ' + baseline:>16}")
    for name, value in rows:
        print(f"{name:<34} {value:>9.3f} {value / base:>15.2f}x")


PLAIN_LOGINS_HELP = ("Empty ~/.bashrc on every node (each node's own home layer): measures "
                     "what this box's login scripts (pyenv init) cost.")


def plain_logins(inventory_path: str | Path) -> None:
    """Every node's ~/.bashrc emptied, in the node's own layer over root's home (the
    host's stays as it is): logins then cost only sshd and the shell."""
    subprocess.run([*GPUCLUSTER, "run", "-i", str(inventory_path), ": > ~/.bashrc"],
                   capture_output=True, check=True)
