"""bench/launch: `gpucluster launch` against a hand-written loop of `scp` + `ssh node
torchrun ...` (OpenSSH, every node at once), on the same sandbox nodes in the same run.

    sudo .venv/bin/python -m bench.launch [--nodes 3] [--runs 3]

1. launch to init: from the command's start to the moment the last rank is past
   init_process_group (each rank prints time.time() there; one clock: the sandbox),
   split in two: to the last node's torchrun starting (what the launcher costs), and
   from there to init (what torch costs, the same program either way).
2. failure to clean: the workers on the last node are SIGKILLed mid-run; the time until
   no process of the job is left on any node (seen with `ip netns pids`), and, for
   gpucluster, until the CLI has exited with its first-failure summary.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import (
    GPUCLUSTER,
    add_login_options,
    median_of,
    sandbox,
    shape_logins,
)

# Each rank also prints when its torchrun started (its parent's start time from /proc,
# on the sandbox's one clock): what the launcher costs is then told apart from what
# torch costs.
TORCHRUN_STARTED = """\
import os
def torchrun_started():
    import time
    ticks = int(open(f"/proc/{os.getppid()}/stat").read().rsplit(")", 1)[1].split()[19])
    booted = time.time() - float(open("/proc/uptime").read().split()[0])  # to 10 ms
    return booted + ticks / os.sysconf("SC_CLK_TCK")
"""
INIT_JOB = TORCHRUN_STARTED + """\
import time, torch.distributed as dist
dist.init_process_group("gloo")
print("INIT", dist.get_rank(), repr(time.time()), "TORCHRUN", repr(torchrun_started()),
      flush=True)
dist.barrier()
dist.destroy_process_group()
"""
LONG_JOB = """\
import time, torch.distributed as dist
dist.init_process_group("gloo")
print("INIT", dist.get_rank(), repr(time.time()), flush=True)
while True:
    dist.barrier()
    time.sleep(0.05)
"""


def _ssh(inventory: dict, address: str) -> list[str]:
    defaults = inventory["defaults"]
    return ["ssh", "-i", defaults["identity_file"], "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={inventory['cluster']['known_hosts']}",
            "-o", "StrictHostKeyChecking=yes", f"root@{address}"]


def _ssh_loop(inventory: dict, script: Path) -> list[subprocess.Popen[str]]:
    """What one writes by hand: copy the script, then torchrun over ssh on each node."""
    hosts = inventory["hosts"]
    head = hosts[0]["address"]
    torchrun = inventory["cluster"]["torchrun"]
    processes = []
    for host in hosts:
        ssh = _ssh(inventory, host["address"])
        # No `exec`: torchrun's start time (what the ranks read) is then when it ran,
        # not when the login shell it would replace started, before the login scripts.
        remote = (f"mkdir -p /srv/bench && cat > /srv/bench/{script.name} && cd /srv/bench && "
                  f"{torchrun} --nnodes {len(hosts)} --nproc-per-node 2 "
                  f"--rdzv-backend c10d --rdzv-endpoint {head}:29500 --rdzv-id loop "
                  f"{script.name}")
        processes.append(subprocess.Popen([*ssh, remote], stdin=script.open("rb"),
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
    return processes


def _last_init(output: str) -> float:
    stamps = [float(s) for s in re.findall(r"INIT \d+ ([0-9.]+)", output)]
    return max(stamps)


def _last_torchrun_start(output: str) -> float:
    """When the last node's torchrun started (to about 20 ms: /proc's clock ticks)."""
    return max(float(s) for s in re.findall(r"TORCHRUN ([0-9.]+)", output))


def _job_pids(name: str, nodes: list[str], pattern: bytes) -> list[str]:
    found = []
    for node in nodes:
        pids = subprocess.run(["ip", "netns", "pids", f"{name}-{node}"], capture_output=True,
                              text=True, check=False).stdout.split()
        for pid in pids:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if pattern in cmdline:
                found.append(pid)
    return found


def _wait_clean(name: str, nodes: list[str], pattern: bytes, since: float,
                limit: float = 120) -> float:
    while _job_pids(name, nodes, pattern):
        if time.time() - since > limit:
            return float("inf")
        time.sleep(0.05)
    return time.time() - since


def _kill_workers(name: str, node: str, pattern: bytes) -> float:
    killed_at = time.time()
    for pid in _job_pids(name, [node], pattern):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"torchrun" not in cmdline:
            os.kill(int(pid), signal.SIGKILL)
    return killed_at


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    add_login_options(parser)
    args = parser.parse_args()
    name = "gpcbench"
    with tempfile.TemporaryDirectory() as tmp, \
            sandbox(name, "198.18.9.0/24", args.nodes, Path(tmp)) as inventory:
        nodes = [h["name"] for h in inventory["hosts"]]
        path = inventory["path"]
        subprocess.run([*GPUCLUSTER, "provision", "-i", path, "--only", "hosts"], check=True,
                       capture_output=True)
        shape_logins(path, args)
        project = Path(tmp) / "bench_project"
        project.mkdir()
        (project / "init_job.py").write_text(INIT_JOB)
        (project / "long_job.py").write_text(LONG_JOB)
        launch = [*GPUCLUSTER, "launch", "-i", path, "--nproc-per-node", "2"]

        to_init: dict[str, list[float]] = {"gpucluster launch": [], "ssh loop": []}
        # Of which: from the start to the last node's torchrun, then torchrun to init.
        to_torchrun: dict[str, list[float]] = {"gpucluster launch": [], "ssh loop": []}
        for _ in range(args.runs):
            started = time.time()
            output = subprocess.run([*launch, "init_job.py"], cwd=project,
                                    capture_output=True, text=True, check=True).stdout
            to_init["gpucluster launch"].append(_last_init(output) - started)
            to_torchrun["gpucluster launch"].append(_last_torchrun_start(output) - started)
            started = time.time()
            loop = _ssh_loop(inventory, project / "init_job.py")
            output = "".join(p.communicate(timeout=120)[0] for p in loop)
            to_init["ssh loop"].append(_last_init(output) - started)
            to_torchrun["ssh loop"].append(_last_torchrun_start(output) - started)

        to_clean: dict[str, list[float]] = {"gpucluster launch": [], "gpucluster CLI exit": [],
                                            "ssh loop": []}
        for _ in range(args.runs):
            process = subprocess.Popen([*launch, "--grace", "5", "long_job.py"], cwd=project,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert process.stdout is not None
            ready = 0
            while ready < 2 * len(nodes):
                line = process.stdout.readline()
                if not line:  # it ended before every rank was up: say why, do not spin
                    raise SystemExit(f"launch ended before the job was up: "
                                     f"{process.communicate(timeout=60)[1][-2000:]}")
                ready += "INIT" in line
            time.sleep(1)
            killed_at = _kill_workers(name, nodes[-1], b"long_job.py")
            to_clean["gpucluster launch"].append(
                _wait_clean(name, nodes, b"long_job.py", killed_at))
            process.communicate(timeout=120)
            to_clean["gpucluster CLI exit"].append(time.time() - killed_at)

            loop = _ssh_loop(inventory, project / "long_job.py")
            time.sleep(12)  # past init on 2 cores
            killed_at = _kill_workers(name, nodes[-1], b"long_job.py")
            to_clean["ssh loop"].append(_wait_clean(name, nodes, b"long_job.py", killed_at))
            for process_ in loop:
                process_.kill()
            for pid in _job_pids(name, nodes, b"long_job.py"):  # what the loop left behind
                os.kill(int(pid), signal.SIGKILL)

    delay = f", every login {args.login_delay:g} s slower" if args.login_delay else ""
    print(f"\n{args.nodes} nodes x 2 processes, gloo, median of {args.runs}{delay}")
    base = median_of(to_init["ssh loop"])
    print(f"{'launch to every rank past init':<36} {'median s':>9} {'vs ssh loop':>12}")
    for label, values in to_init.items():
        print(f"{label:<36} {median_of(values):>9.2f} {median_of(values) / base:>11.2f}x")
    print(f"\n{'of which':<36} {'to torchrun':>12} {'then to init':>13}   runs (to torchrun)")
    for label, values in to_torchrun.items():
        then = [init - start for init, start in zip(to_init[label], values, strict=True)]
        shown = " ".join(f"{v:.2f}" for v in values)
        print(f"{label:<36} {median_of(values):>12.2f} {median_of(then):>13.2f}   {shown}")
    print(f"\n{'node failure to every node clean':<36} {'median s':>9} {'runs':>12}")
    for label, values in to_clean.items():
        shown = " ".join(f"{v:.1f}" for v in values)
        print(f"{label:<36} {median_of(values):>9.2f}   {shown}")


if __name__ == "__main__":
    main()
