"""bench/bundle: `gpucluster bundle` on sandbox nodes, against `gpucluster doctor` (the
part of it that is doctor) and `run true` in the same run.

    sudo .venv/bin/python -m bench.bundle [--nodes 8] [--runs 3]

Goals: 8 nodes in 30 s or less; the archive (no job) under 50 MB.
"""

from __future__ import annotations

import argparse
import subprocess
import tarfile
import tempfile
from pathlib import Path

from bench.common import GPUCLUSTER, median_of, print_table, sandbox, timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir, \
            sandbox("gpcbbun", "198.18.62.0/24", args.nodes, Path(workdir)) as inventory:
        archive = Path(workdir) / "bench.tar.gz"

        def complete(done: subprocess.CompletedProcess[str]) -> None:
            assert done.returncode == 0, done.stderr
            with tarfile.open(archive) as bundle:
                names = bundle.getnames()
            assert sum(n.endswith("nvidia-smi-q.txt") for n in names) == args.nodes

        def answered(done: subprocess.CompletedProcess[str]) -> None:
            assert done.returncode in (0, 1), done.stderr  # findings are not failures here

        path = inventory["path"]
        bundles = [timed([*GPUCLUSTER, "bundle", "-i", path, "-o", str(archive)], complete)
                   for _ in range(args.runs)]
        doctors = [timed([*GPUCLUSTER, "doctor", "-i", path], answered)
                   for _ in range(args.runs)]
        runs = [timed([*GPUCLUSTER, "run", "-i", path, "true"], answered)
                for _ in range(args.runs)]
        print_table(f"bundle on {args.nodes} nodes, no job (median of {args.runs})",
                    [("gpucluster run true", median_of(runs)),
                     ("gpucluster doctor", median_of(doctors)),
                     ("gpucluster bundle", median_of(bundles))], "gpucluster run true")
        size = archive.stat().st_size
        with tarfile.open(archive) as bundle:
            unpacked = sum(m.size for m in bundle.getmembers())
        print(f"\narchive: {size / 1024 / 1024:.2f} MiB ({unpacked / 1024 / 1024:.2f} MiB "
              f"unpacked); goals: {median_of(bundles):.1f} s <= 30 s, < 50 MB")


if __name__ == "__main__":
    main()
