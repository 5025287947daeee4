"""bench/recover: `gpucluster launch --recover` when a node loses power mid-run, on a
sandbox of its own (4 nodes x 2 processes, gloo), with the default settings.

    sudo .venv/bin/python -m bench.recover [--runs 3]

A node's power-off is staged as a real one looks from outside: its traffic is dropped
both ways first (so no FIN or RST ever leaves it), then every process in it dies. Then:

1. detection: from the power-off to the launcher saying the attempt ended (goal <= 15 s);
2. restart: from then to every rank of the next attempt past init_process_group, as each
   rank prints it (goal <= 30 s);
3. work lost: the epochs done before the power-off that the next attempt does again
   (goal: at most one checkpoint interval, here one epoch).

The peer is a person doing the same by hand (`stop`, then `launch` on the other nodes):
not timed here, since the person's reaction time dominates; torchrun alone does not
re-form the job at all (docs/launch.md).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import re
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from bench.common import GPUCLUSTER, ROOT, median_of, sandbox

INIT_MARK = """
import time as _time, os as _os
print("INIT", _os.environ["GPUCLUSTER_ATTEMPT"], repr(_time.time()), flush=True)
"""


def _job(directory: Path) -> None:
    """examples/train.py, printing when each rank is past init_process_group."""
    train = (ROOT / "examples" / "train.py").read_text()
    anchor = "    rank, world = dist.get_rank(), dist.get_world_size()\n"  # the line after init
    if anchor not in train:
        raise SystemExit(f"examples/train.py no longer has {anchor.strip()!r} after "
                         f"init_process_group: point bench/recover.py at the new line")
    (directory / "train.py").write_text(train.replace(
        anchor, anchor + "".join(f"    {line}\n" for line in INIT_MARK.strip().splitlines())))


def _power_off(name: str, node: str) -> float:
    namespace = f"{name}-{node}"
    for chain in ("INPUT", "OUTPUT"):
        subprocess.run(["ip", "netns", "exec", namespace, "iptables", "-I", chain, "-j",
                        "DROP"], check=True)
    off = time.time()
    for pid in subprocess.run(["ip", "netns", "pids", namespace], capture_output=True,
                              text=True, check=True).stdout.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    return off


def one_run(inventory: dict, project: Path) -> tuple[float, float, int]:
    process = subprocess.Popen(
        [*GPUCLUSTER, "launch", "-i", inventory["path"], "--nproc-per-node", "2",
         "--recover", "train.py", "--", "--epochs", "12", "--step-delay", "0.05"],
        cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[tuple[float, str]] = queue.Queue()
    for stream in (process.stdout, process.stderr):
        threading.Thread(target=lambda s=stream: [lines.put((time.time(), x)) for x in s],
                         daemon=True).start()
    seen: list[tuple[float, str]] = []

    def until(pattern: str, limit: float = 300) -> float:
        deadline = time.time() + limit
        while time.time() < deadline:
            with contextlib.suppress(queue.Empty):
                at, line = lines.get(timeout=0.5)
                seen.append((at, line))
                if re.search(pattern, line):
                    return at
        raise RuntimeError(f"no {pattern!r} within {limit}s:\n" + "".join(
            x for _, x in seen[-30:]))

    until(r"epoch 3 loss")
    last_done = max(int(m[1]) for _, x in seen if (m := re.search(r"epoch (\d+) loss", x)))
    off = _power_off(inventory["name"], inventory["hosts"][-1]["name"])
    ended = until(r"attempt 1 ended")
    until(r"resumed from epoch")
    resumed = max(int(m[1]) for _, x in seen if (m := re.search(r"resumed from epoch (\d+)",
                                                                  x)))
    process.wait(timeout=300)
    for at, line in iter(lambda: lines.get(timeout=1), None):  # the rest of the output
        seen.append((at, line))
        if lines.empty():
            break
    inits = [float(m[1]) for _, x in seen if (m := re.search(r"INIT 2 ([0-9.]+)", x))]
    return ended - off, max(inits) - ended, max(last_done - resumed, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    detection, restart, lost = [], [], []
    with tempfile.TemporaryDirectory() as temporary:
        work = Path(temporary)
        project = work / "project"
        project.mkdir()
        _job(project)
        for run in range(args.runs):
            with sandbox("gpcbrec", "198.18.60.0/24", 4, work) as inventory:
                inventory["name"] = "gpcbrec"
                subprocess.run([*GPUCLUSTER, "provision", "-i", inventory["path"], "--only",
                                "hosts,ssh-mesh"], check=True, capture_output=True)
                found = one_run(inventory, project)
                print(f"run {run + 1}: detection {found[0]:.1f}s, restart {found[1]:.1f}s, "
                      f"epochs redone {found[2]}", flush=True)
                detection.append(found[0])
                restart.append(found[1])
                lost.append(found[2])
    print(f"\npower-off of 1 of 4 nodes (x2 processes, gloo), defaults, median of {args.runs}")
    print(f"{'measured':<44} {'median':>8} {'goal':>8}")
    print(f"{'power-off to recovery start (s)':<44} {median_of(detection):>8.1f} {15:>8}")
    print(f"{'recovery start to every rank past init (s)':<44} {median_of(restart):>8.1f} "
          f"{30:>8}")
    print(f"{'epochs done again (checkpoint every epoch)':<44} {max(lost):>8} {1:>8}")


if __name__ == "__main__":
    main()
