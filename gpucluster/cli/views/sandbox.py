"""`sandbox up`, `status` and `down`: what was started, each node's state, what was
removed."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.console import Console

from gpucluster.cli.views.common import print_table
from gpucluster.sandbox.cluster import NodeStatus, UpResult
from gpucluster.sandbox.spec import SandboxSpec
from gpucluster.wording import counted


def print_up(console: Console, result: UpResult) -> None:
    spec = result.spec
    started = ", ".join(result.started) or "none (all were up)"
    console.print(f"sandbox {spec.name}: {counted(len(spec.nodes), 'node')} on {spec.subnet}; "
                  f"started: {started}")
    if result.removed:
        console.print(f"removed: {', '.join(result.removed)}")
    if spec.login:
        home = "one home shared by every node" if spec.login.shared_home else \
            "a home of its own on each node"
        console.print(f"nodes are reached as {spec.login.user} (sudo: {spec.login.sudo}; "
                      f"{home})")
    console.print("GPUs are SIMULATED: each node's nvidia-smi replays a real capture.")
    console.print(f"inventory: {result.inventory}")
    console.print(f"try: gpucluster run -i {result.inventory} 'hostname; nproc'")


def status_payload(name: str, spec: SandboxSpec, rows: list[NodeStatus]) -> dict[str, Any]:
    return {"sandbox": name, "subnet": spec.subnet, "gpus_simulated": True,
            "nodes": [{**asdict(r), "up": r.up} for r in rows]}


def print_status(console: Console, name: str, spec: SandboxSpec,
                 rows: list[NodeStatus]) -> None:
    print_table(console, f"sandbox {name} ({spec.subnet}); GPUs are SIMULATED",
                ["node", "address", "state", "sshd pid", "GPUs", "link"],
                [[r.name, r.address, "up" if r.up else "DOWN", str(r.sshd_pid or "-"),
                  r.gpus, (r.link_rate or "unshaped") + (f", MTU {r.mtu}" if r.mtu else "")]
                 for r in rows])


def print_down(console: Console, name: str, removed: list[str]) -> None:
    if not removed:
        console.print(f"sandbox {name}: nothing to remove")
    for item in removed:
        console.print(f"removed {item}")
