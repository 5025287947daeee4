"""Shared by the benchmarks: a sandbox of their own, timing, and ratio printing.

Benchmarks print figures; they never assert timings (those are noisy on 2 cores).
"""

from __future__ import annotations

import argparse
import os
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


def byte_compile_cli() -> None:
    """The gpucluster the benchmarks run, byte-compiled as `pip install` leaves it. An
    editable install has no .pyc until Python writes them, and where
    PYTHONDONTWRITEBYTECODE is set (this box's shells) it never does: every start then
    compiled each module it imports, 0.1 s of `launch -d` here that no user pays."""
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("gpucluster")  # the tree on PYTHONPATH in an A/B run
    for where in (spec.submodule_search_locations or []) if spec else []:
        compileall.compile_dir(where, quiet=1)


@contextmanager
def sandbox(name: str, subnet: str, nodes: int, workdir: Path,
            extra: tuple[str, ...] = ()) -> Iterator[dict]:
    """A sandbox just for this benchmark, for the CLI as installed; always taken down,
    even on Ctrl-C."""
    byte_compile_cli()
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


def succeeded(done: subprocess.CompletedProcess[str]) -> None:
    """timed()'s check for a command that must exit 0."""
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, done.args[-3:]))} failed (exit "
                         f"{done.returncode}):\n{done.stdout[-1500:]}\n{done.stderr[-500:]}")


def median_of(runs: list[float]) -> float:
    return statistics.median(runs)


def print_table(title: str, rows: list[tuple[str, float]], baseline: str) -> None:
    base = dict(rows)[baseline]
    print(f"\n{title}")
    print(f"{'tool':<34} {'median s':>9} {'vs ' + baseline:>16}")
    for name, value in rows:
        print(f"{name:<34} {value:>9.3f} {value / base:>15.2f}x")


CPU_LIMIT_GROUP = "gpcbench-cpus"
CPUS_HELP = ("Run the benchmark, its sandbox nodes included, in a cgroup limited to this "
             "many CPUs' worth of time (e.g. 1 or 1.5): how a figure moves with the CPU "
             "the nodes share.")


@contextmanager
def cpu_limit(cores: float | None) -> Iterator[None]:
    """This process, and so every sandbox node it starts (their sshd and all they run),
    limited to `cores` CPUs of time by the cgroup cpu controller (v1 or v2); nothing
    when `cores` is None. The group is removed after (its processes are gone by then)."""
    if cores is None:
        yield
        return
    quota, period = int(cores * 100_000), 100_000
    v1, v2 = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
    if (v1 / "cpu.cfs_quota_us").exists():
        group, parent_procs = v1 / CPU_LIMIT_GROUP, v1 / "cgroup.procs"
        group.mkdir(exist_ok=True)
        (group / "cpu.cfs_period_us").write_text(f"{period}\n")
        (group / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    elif (v2 / "cgroup.subtree_control").exists():
        group, parent_procs = v2 / CPU_LIMIT_GROUP, v2 / "cgroup.procs"
        (v2 / "cgroup.subtree_control").write_text("+cpu\n")
        group.mkdir(exist_ok=True)
        (group / "cpu.max").write_text(f"{quota} {period}\n")
    else:
        raise SystemExit("--cpus needs the cgroup cpu controller (v1 or v2) mounted under "
                         "/sys/fs/cgroup")
    (group / "cgroup.procs").write_text(f"{os.getpid()}\n")
    try:
        yield
    finally:
        parent_procs.write_text(f"{os.getpid()}\n")
        try:
            group.rmdir()
        except OSError:  # a process of the benchmark still in it; the group stays
            print(f"note: {group} is not empty; remove it later", file=sys.stderr)


def machine_cpu_seconds() -> float:
    """CPU time the whole machine has spent busy (every core, every process, the kernel's
    network work included), from /proc/stat: read before and after a run."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def add_login_options(parser: argparse.ArgumentParser) -> None:
    """--plain-logins and --login-delay: what the nodes' login scripts cost, either way."""
    parser.add_argument("--plain-logins", action="store_true",
                        help="Empty ~/.bashrc on every node (each node's own home layer): "
                             "measures what this box's login scripts (pyenv init) cost.")
    parser.add_argument("--login-delay", type=float, default=0.0,
                        help="Make every login on the nodes take this many seconds longer (a "
                             "sleep in each node's own ~/.bashrc), as conda or module init do "
                             "on real clusters: what each login a tool makes costs there.")


def shape_logins(inventory_path: str | Path, args: argparse.Namespace) -> None:
    """Apply add_login_options' choices to every node's ~/.bashrc, in the node's own layer
    over root's home (the host's stays as it is). The delay is a sleep: a login that
    waits, without the CPU a real init script would also use."""
    edits = ([": > ~/.bashrc"] if args.plain_logins else []) + \
        ([f"echo 'sleep {args.login_delay:g}' >> ~/.bashrc"] if args.login_delay else [])
    if edits:
        subprocess.run([*GPUCLUSTER, "run", "-i", str(inventory_path), "; ".join(edits)],
                       capture_output=True, check=True)
