"""Run every nvidia-smi command gpucluster sends, as it sends them, then doctor's probe
for INVENTORY; write their raw outputs to OUT, one `# $ command` section each (the form
tests/fixtures/<model>/ keeps). Run from the repository's root: raw.py INVENTORY OUT."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, ".")
sys.path.insert(0, "templates/observe")
import node_gpus  # type: ignore[import-not-found]

from gpucluster.doctor import nvidia_smi
from gpucluster.doctor.probe import render_probe
from gpucluster.inventory import load


def commands() -> list[str]:
    probe_format = "--format=csv,nounits"
    sampler = f"{node_gpus.GPU_FIELDS} {node_gpus.FORMAT}"
    return [
        "nvidia-smi --version", "nvidia-smi -L", "nvidia-smi", "nvidia-smi topo -m",
        f"nvidia-smi --query-gpu={','.join(nvidia_smi.QUERY_FIELDS)} {probe_format}",
        f"nvidia-smi --query-compute-apps={','.join(nvidia_smi.APP_FIELDS)} {probe_format}",
        f"nvidia-smi --query-gpu={node_gpus.GPU_FIELDS},{node_gpus.EXTRA_GPU_FIELDS} "
        f"{node_gpus.FORMAT}",
        f"nvidia-smi --query-gpu={sampler}",
        f"nvidia-smi --query-compute-apps={node_gpus.APP_FIELDS} {node_gpus.FORMAT}",
        "nvidia-smi --query-gpu=index,uuid --format=csv,noheader,nounits",
        "nvidia-smi --query-compute-apps=pid --format=csv,noheader",  # Slurm's epilog
        "nvidia-smi --query-gpu=name --format=csv,noheader",  # Slurm's GRES facts
        "nvidia-smi -q",
    ]


def main(inventory: str, out: str) -> None:
    with Path(out).open("w") as sink:
        for command in commands():
            started = time.monotonic()
            try:
                done = subprocess.run(shlex.split(command), capture_output=True, text=True,
                                      timeout=60, check=False)
            except (OSError, subprocess.TimeoutExpired) as error:
                sink.write(f"# $ {command}\n# failed: {error}\n")
                continue
            sink.write(f"# $ {command}\n# rc {done.returncode} in "
                       f"{time.monotonic() - started:.2f}s\n{done.stdout}{done.stderr}\n")
        sent_at = time.time()
        done = subprocess.run(["bash", "-s"], input=render_probe(load(inventory)),
                              capture_output=True, text=True, timeout=120, check=False,
                              env=dict(os.environ, GPC_CONNECT="1"))
        sink.write(f"# $ doctor probe (sent_at {sent_at})\n# rc {done.returncode}\n"
                   f"{done.stdout}\n# stderr\n{done.stderr}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
