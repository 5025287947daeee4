"""Is Slurm answering? Each node idle (or busy) in sinfo, munge credentials accepted
across nodes, and `srun -N <n> hostname` answered by every node."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Protocol

from gpucluster.remote.result import CommandResult
from gpucluster.slurm_states import SINFO, is_healthy, parse_sinfo, problem_of


class Runs(Protocol):
    def run(self, command: str, timeout: float, *, sudo: bool = ...,
            stdin: bytes | None = ...) -> CommandResult: ...


def node_states(controller: Runs) -> dict[str, tuple[str, str]]:
    result = controller.run(SINFO, timeout=30, sudo=True)
    return parse_sinfo(result.stdout) if result.ok else {}


def wait_healthy(controller: Runs, names: Sequence[str], timeout_s: float
                 ) -> dict[str, str]:
    """Wait until every node is healthy; then {} else node -> what is wrong."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = node_states(controller)
        problems = {n: problem_of(*states[n]) if n in states else "not in sinfo's list"
                    for n in names if n not in states or not is_healthy(states[n][0])}
        if not problems or time.monotonic() > deadline:
            return problems
        time.sleep(0.5)


def munge_across(controller: Runs, controller_name: str, nodes: Mapping[str, Runs]
                 ) -> dict[str, str]:
    """Every node's credential decoded on the controller host, and the controller's on
    every node: a node with another key (or a stopped munged) is named."""
    problems: dict[str, str] = {}
    own = controller.run("munge -n", timeout=30, sudo=True)
    for name, node in nodes.items():
        if name == controller_name:
            continue
        made = node.run("munge -n", timeout=30, sudo=True)
        if not made.ok:
            problems[name] = f"munge -n failed: {made.stderr.strip()[-200:]}"
            continue
        there = controller.run("unmunge", timeout=30, sudo=True, stdin=made.stdout.encode())
        back = node.run("unmunge", timeout=30, sudo=True, stdin=own.stdout.encode())
        for what, answer in ((f"{controller_name} rejects its credential", there),
                             (f"it rejects {controller_name}'s credential", back)):
            if not answer.ok:
                problems[name] = f"munge: {what} ({answer.stderr.strip()[-160:]})"
    return problems


def srun_everywhere(controller: Runs, names: Sequence[str], timeout_s: float) -> str | None:
    """`srun -N <n> hostname` on the controller host; None when every node answered."""
    count = len(names)
    command = (f"timeout {int(timeout_s)} srun -N {count} -n {count} --immediate=30 "
               f"hostname -s")
    result = controller.run(command, timeout=timeout_s + 10, sudo=True)
    answered = sorted(set(result.stdout.split()))
    if result.ok and answered == sorted(names):
        return None
    missing = sorted(set(names) - set(answered))
    detail = result.stderr.strip().splitlines()[-1:] if result.stderr.strip() else []
    return (f"`{command}` " + (f"had no answer from {', '.join(missing)}"
            if missing else f"exited {result.exit_code}")
            + (f": {detail[0]}" if detail else ""))
