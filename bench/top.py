"""bench/top: what `gpucluster top` costs, on sandbox nodes.

    sudo .venv/bin/python -m bench.top [--nodes 16] [--runs 3] [--seconds 20]

1. The sampler's own overhead on a node at --interval 1: CPU time over `--seconds`
   (as % of one core) and resident memory, read from /proc of the node's sampler
   process; its two nvidia-smi loops are reported apart (on the sandbox they are the
   simulated nvidia-smi, a Python program; a real one's cost differs).
2. Time to the first full frame on --nodes nodes: `top --once --json` against
   `gpucluster run true` (the same connections, nothing sampled), medians of --runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import GPUCLUSTER, median_of, print_table, sandbox, timed

TICKS = os.sysconf("SC_CLK_TCK")


def _processes(namespace: str) -> dict[int, str]:
    pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True,
                          check=True).stdout.split()
    found = {}
    for pid in pids:
        try:
            found[int(pid)] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ") \
                .decode(errors="replace")
        except OSError:
            continue
    return found


def _parent(pid: int) -> int:
    return next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text()
                .splitlines() if line.startswith("PPid:"))


def _cpu_and_rss(pid: int) -> tuple[float, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text()
               .splitlines() if line.startswith("VmRSS:"))
    return (int(fields[11]) + int(fields[12])) / TICKS, rss  # seconds, KiB


def overhead(inventory: dict, seconds: float) -> None:
    top = subprocess.Popen([*GPUCLUSTER, "top", "-i", inventory["path"], "--json",
                            "--interval", "1"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        time.sleep(5)  # started, first frames sent
        namespace = f"{inventory['name']}-node1"
        running = _processes(namespace)
        loops = [p for p, cmd in running.items() if "nvidia_smi" in cmd and "-lms" in cmd]
        sampler = sorted({_parent(p) for p in loops})  # the loops' parent
        assert len(loops) == 2 and len(sampler) == 1, f"no sampler found in {namespace}"
        before = {p: _cpu_and_rss(p) for p in sampler + loops}
        time.sleep(seconds)
        after = {p: _cpu_and_rss(p) for p in sampler + loops}
    finally:
        top.terminate()
        top.wait(timeout=30)

    def share(pids: list[int]) -> tuple[float, float]:
        cpu = sum(after[p][0] - before[p][0] for p in pids) / seconds * 100
        return cpu, sum(after[p][1] for p in pids) / 1024

    cpu, rss = share(sampler)
    loop_cpu, loop_rss = share(loops)
    print(f"\nsampler at --interval 1 over {seconds:g}s on one node")
    print(f"{'process':<40} {'% of a core':>12} {'RSS MiB':>9}")
    print(f"{'sampler (python3, goal <1% and 20 MiB)':<40} {cpu:>12.2f} {rss:>9.1f}")
    print(f"{'its 2 nvidia-smi loops (simulated)':<40} {loop_cpu:>12.2f} {loop_rss:>9.1f}")


def first_frame(inventory: dict, runs: int) -> None:
    def frame_complete(done: subprocess.CompletedProcess[str]) -> None:
        snapshot = json.loads(done.stdout)
        assert done.returncode == 0 and all(n["gpus"] for n in snapshot["nodes"]), done.stderr

    def answered(done: subprocess.CompletedProcess[str]) -> None:
        assert done.returncode == 0, done.stderr

    top = [timed([*GPUCLUSTER, "top", "-i", inventory["path"], "--once", "--json"],
                 frame_complete) for _ in range(runs)]
    run = [timed([*GPUCLUSTER, "run", "-i", inventory["path"], "true"], answered)
           for _ in range(runs)]
    print_table(f"first full frame on {len(inventory['hosts'])} nodes (median of {runs})",
                [("gpucluster run true", median_of(run)),
                 ("gpucluster top --once --json", median_of(top))], "gpucluster run true")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir, \
            sandbox("gpcbtop", "198.18.61.0/24", args.nodes, Path(workdir)) as inventory:
        inventory["name"] = "gpcbtop"
        first_frame(inventory, args.runs)
        overhead(inventory, args.seconds)


if __name__ == "__main__":
    main()
