"""bench/doctor: `gpucluster doctor` on 16 sandbox nodes against `gpucluster run true` on
the same nodes in the same run (goal: doctor <= 2x). Both open fresh connections.

    sudo .venv/bin/python -m bench.doctor [--nodes 16] [--runs 5]

The first doctor run on a node imports torch to read its versions (seconds; cached on
the node afterwards, keyed by the python and torch install): reported separately as
"cold", the others as warm.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from bench.common import GPUCLUSTER, median_of, print_table, sandbox, timed

TORCH_CACHE = Path.home() / ".cache" / "gpucluster"


def _ran(done: subprocess.CompletedProcess[str]) -> None:
    if done.returncode not in (0, 1):  # doctor exits 1 on findings: still a full run
        raise SystemExit(f"run failed (exit {done.returncode}):\n{done.stderr[-800:]}")


def _warm_up(doctor: list[str], tries: int = 3) -> None:
    """Until every node's torch versions are cached: warm runs are to measure the
    cache, not imports cut off on an overloaded box (which would not be cached)."""
    for attempt in range(1, tries + 1):
        done = subprocess.run([*doctor, "--only", "torch", "--json"], capture_output=True,
                              text=True, check=False)
        results = json.loads(done.stdout)["results"] if done.stdout else []
        if results and all(r["status"] == "OK" for r in results):
            print(f"torch versions cached on every node after {attempt} warm-up run(s)")
            return
    raise SystemExit(f"torch's versions were still not cached on every node after {tries} "
                     f"runs: warm figures would measure imports")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    # Each node's home is its own layer over this host's: a cache here is every node's
    # until a node writes its own, so a cold run starts with none here.
    shutil.rmtree(TORCH_CACHE, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp, \
            sandbox("gpcbench", "198.18.9.0/24", args.nodes, Path(tmp)) as inventory:
        doctor = [*GPUCLUSTER, "doctor", "-i", inventory["path"]]
        run_true = [*GPUCLUSTER, "run", "-i", inventory["path"], "true"]
        cold = timed(doctor, _ran)
        _warm_up(doctor)
        timings: dict[str, list[float]] = {"gpucluster run true": [], "gpucluster doctor": []}
        for _ in range(args.runs):
            timings["gpucluster run true"].append(timed(run_true, _ran))
            timings["gpucluster doctor"].append(timed(doctor, _ran))
        rows = [(name, median_of(runs)) for name, runs in timings.items()]
        rows.append(("gpucluster doctor (cold torch cache)", cold))
        print_table(f"doctor vs run true, {args.nodes} nodes, median of {args.runs}", rows,
                    "gpucluster run true")


if __name__ == "__main__":
    main()
