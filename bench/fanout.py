"""bench/fanout: `gpucluster run hostname` on 16 sandbox nodes, cold (new connections
every run), against pdsh, Ansible and Fabric's ThreadingGroup on the same nodes in the
same run, host keys verified by all four. Also times `gpucluster --help` (start-up
cost). Fabric is the SSH library the project's brief named; gpucluster uses paramiko
directly, and this row keeps that choice measured.

    sudo .venv/bin/python -m bench.fanout [--nodes 16] [--runs 7]

Needs: scripts/setup --bench (Fabric; pdsh and ansible-core come with the test tools).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import GPUCLUSTER, ROOT, median_of, print_table, sandbox, timed

PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"  # scripts/setup --bench

# Fabric 3's ThreadingGroup, host keys verified against the sandbox's known_hosts (its
# default would add unknown keys). One thread per host, as its docs show.
FABRIC = """\
import sys, paramiko
from fabric import ThreadingGroup
known_hosts, key, *hosts = sys.argv[1:]
group = ThreadingGroup(*hosts, user="root", connect_kwargs={"key_filename": key,
                       "look_for_keys": False, "allow_agent": False})
for connection in group:
    connection.client.load_host_keys(known_hosts)
    connection.client.set_missing_host_key_policy(paramiko.RejectPolicy())
for result in group.run("hostname", hide=True).values():
    print(result.stdout.strip())
"""


def _expect_hostnames(count: int):
    def check(done: subprocess.CompletedProcess[str]) -> None:
        names = {f"node{i}" for i in range(1, count + 1)}
        missing = [n for n in names if n not in done.stdout]
        if done.returncode != 0 or missing:
            raise SystemExit(f"run failed (exit {done.returncode}), missing {missing}:\n"
                             f"{done.stdout[-500:]}\n{done.stderr[-500:]}")
    return check


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    for tool in ("pdsh", "ansible"):
        if shutil.which(tool) is None and not (Path(sys.executable).parent / tool).exists():
            raise SystemExit(f"{tool} missing: run scripts/setup")
    if not PEERS_PYTHON.exists():
        raise SystemExit("fabric missing: run scripts/setup --bench")
    ansible = str(Path(sys.executable).parent / "ansible")

    with tempfile.TemporaryDirectory() as tmp, \
            sandbox("gpcbench", "198.18.9.0/24", args.nodes, Path(tmp)) as inventory:
        known_hosts = inventory["cluster"]["known_hosts"]
        key = inventory["defaults"]["identity_file"]
        addresses = [h["address"] for h in inventory["hosts"]]
        ssh_options = (f"-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes "
                       f"-o BatchMode=yes -o ControlMaster=no -o ControlPath=none -i {key}")

        ansible_inventory = Path(tmp) / "hosts.ini"
        ansible_inventory.write_text("[all]\n" + "".join(
            f"{h['name']} ansible_host={h['address']}\n" for h in inventory["hosts"]) +
            f"[all:vars]\nansible_user=root\nansible_ssh_private_key_file={key}\n"
            f"ansible_ssh_common_args='{ssh_options}'\n")
        ansible_env = {**os.environ, "ANSIBLE_HOST_KEY_CHECKING": "True",
                       "ANSIBLE_SSH_ARGS": "", "ANSIBLE_FORKS": "64",
                       "ANSIBLE_LOCAL_TEMP": tmp, "ANSIBLE_REMOTE_TEMP": "/tmp",
                       "ANSIBLE_NOCOLOR": "1"}
        pdsh_env = {**os.environ, "PDSH_SSH_ARGS": f"-2 -a -x -l%u %h {ssh_options}",
                    "PDSH_RCMD_TYPE": "ssh"}

        commands = {
            "gpucluster run hostname": ([*GPUCLUSTER, "run", "-i", inventory["path"],
                                         "hostname"], None),
            "pdsh -R ssh -f 64 hostname": (["pdsh", "-R", "ssh", "-f", "64", "-l", "root",
                                            "-w", ",".join(addresses), "hostname"], pdsh_env),
            "ansible all -m raw (forks 64)": ([ansible, "all", "-i", str(ansible_inventory),
                                               "-m", "raw", "-a", "hostname", "-f", "64"],
                                              ansible_env),
            "fabric ThreadingGroup.run": ([str(PEERS_PYTHON), "-c", FABRIC, known_hosts, key,
                                           *addresses], None),
        }
        check = _expect_hostnames(args.nodes)
        timings: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):  # interleaved, so drift on the box hits all alike
            for name, (argv, env) in commands.items():
                timings[name].append(timed(argv, check, env))
        rows = [(name, median_of(runs)) for name, runs in timings.items()]
        print_table(f"fan-out, {args.nodes} nodes, cold, median of {args.runs} runs",
                    rows, "pdsh -R ssh -f 64 hostname")
        medians = dict(rows)
        versus_ansible = medians["gpucluster run hostname"] / medians[
            "ansible all -m raw (forks 64)"]
        print(f"gpucluster vs ansible: {versus_ansible:.2f}x")

    help_runs = [timed([*GPUCLUSTER, "--help"], lambda done: None) for _ in range(10)]
    bare = [timed([sys.executable, "-c", "pass"], lambda done: None) for _ in range(10)]
    print(f"\ngpucluster --help: median {median_of(help_runs):.3f} s "
          f"(bare python start-up {median_of(bare):.3f} s)")


if __name__ == "__main__":
    main()
