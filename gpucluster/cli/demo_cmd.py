"""`gpucluster demo`: the whole main job on a local sandbox, one command.

Each step is the real CLI, run as a user would type it (the command is shown first):
sandbox up, a default-drop firewall on the nodes, doctor (the nodes cannot resolve each
other, the rendezvous port is blocked), provision (SSH mesh, /etc/hosts, firewall open
to peers only, all-reduce smoke test), doctor again, launch examples/train.py on 3
nodes x 2 processes, jobs, and sandbox down unless --keep.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from gpucluster.cli.options import stderr_console
from gpucluster.errors import EXIT_FAILED, GpuclusterError, Interrupted
from gpucluster.packaged import packaged_path

DEMO_NAME = "demo"
FIREWALL = ("iptables -A INPUT -i lo -j ACCEPT && iptables -A INPUT -m conntrack --ctstate "
            "ESTABLISHED,RELATED -j ACCEPT && iptables -A INPUT -p tcp --dport 22 -j ACCEPT "
            "&& iptables -P INPUT DROP")
DEMO_SUBNET = "198.18.10.0/24"  # apart from the default sandbox and the benchmarks


def example_script() -> Path:
    """examples/train.py: inside the wheel, or beside the package in a source checkout."""
    return packaged_path("examples/train.py")


def demo(
    keep: Annotated[bool, typer.Option(
        "--keep", help="Leave the sandbox (and its inventory) up afterwards.")] = False,
    nodes: Annotated[int, typer.Option("--nodes", "-n", min=2, max=8)] = 3,
    epochs: Annotated[int, typer.Option(min=1, help="Epochs of examples/train.py.")] = 5,
) -> None:
    """Sandbox up, doctor, provision (with the smoke test), launch examples/train.py
    across the nodes, then sandbox down (needs root: the sandbox is network namespaces)."""
    if os.geteuid() != 0:
        raise GpuclusterError("the demo's sandbox needs root (fix: sudo gpucluster demo)")
    console = stderr_console()
    workspace = Path(tempfile.mkdtemp(prefix="gpucluster-demo-"))
    inventory = workspace / "demo.yaml"
    project = workspace / "project"
    project.mkdir()
    shutil.copy(example_script(), project / "train.py")

    def step(why: str, *args: str, cwd: Path = workspace, may_fail: bool = False) -> int:
        console.print(f"\n[bold]# {why}[/]\n[bold]$ gpucluster {shlex.join(args)}[/]")
        code = subprocess.run([sys.executable, "-m", "gpucluster", *args], cwd=cwd,
                              check=False).returncode
        if code != 0 and not may_fail:
            console.print(f"[bold red]demo: this step failed (exit {code})[/]")
            raise typer.Exit(code)
        return code

    code = EXIT_FAILED
    try:
        step(f"{nodes} local nodes: network namespaces with real sshd, simulated GPUs",
             "sandbox", "up", "--name", DEMO_NAME, "--subnet", DEMO_SUBNET,
             "--nodes", str(nodes), "--write-inventory", str(inventory))
        step("servers often come with a firewall: this one drops everything but SSH",
             "run", "-i", str(inventory), FIREWALL)
        step("fresh servers cannot resolve each other's names, and the firewall blocks the "
             "rendezvous port: doctor says so, with the fix", "doctor", "-i", str(inventory),
             may_fail=True)
        step("make the cluster right: SSH mesh, /etc/hosts, firewall open to peers only, "
             "then an all-reduce across every node", "provision", "-i", str(inventory))
        step("a clean bill of health", "doctor", "-i", str(inventory))
        code = step("train across every node: 2 processes each, gloo on CPUs; Ctrl-C stops "
                    "it everywhere", "launch", "-i", str(inventory), "--nproc-per-node", "2",
                    "train.py", "--", "--epochs", str(epochs), cwd=project)
        step("the job's record, per node", "jobs", "-i", str(inventory))
    except KeyboardInterrupt:
        raise Interrupted("demo interrupted" + ("" if keep else "; removing the sandbox")
                          ) from None
    finally:
        if keep:
            console.print(f"\nsandbox kept; inventory: {inventory}\n  try: gpucluster run -i "
                          f"{inventory} hostname\n  remove it: gpucluster sandbox down --name "
                          f"{DEMO_NAME}")
        else:
            step("take it all down again", "sandbox", "down", "--name", DEMO_NAME,
                 may_fail=True)
            if code == 0:
                shutil.rmtree(workspace, ignore_errors=True)
            else:  # what went wrong stays readable
                console.print(f"logs kept: {workspace / '.gpucluster'}")
    console.print(f"\n[bold green]demo: done[/] (the job exited {code})")
