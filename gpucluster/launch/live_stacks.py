"""Where each rank of a running job is now, without stopping it: py-spy reads each
worker's Python stack (templates/launch/stacks.sh; it pauses the process for the moment
of the read), and the ranks are grouped by where they are, as a hang's stop groups the
stacks its aborts wrote (hang_stacks reads py-spy's dumps too)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpucluster import reports
from gpucluster.inventory import Host, Inventory
from gpucluster.launch import node_scripts
from gpucluster.launch.control import hosts_of
from gpucluster.launch.hang_stacks import StackGroup, grouped, spy_main_thread, where
from gpucluster.launch.jobs import JobRecord
from gpucluster.remote.connection import Connection
from gpucluster.remote.session import Session

SPY_TIMEOUT_S = 20  # one rank's read
STOPPED = " (its process is stopped: SIGSTOP, Ctrl-Z or a debugger)"
_DENIED = re.compile(r"permission denied|not permitted", re.IGNORECASE)
_ENDED = re.compile(r"no such process|failed to find process|check that the process is "
                    r"running", re.IGNORECASE)
PY_SPY_FIX = "pip install py-spy into the job's Python on each node (its venv's bin is " \
             "looked in), or onto their PATH"
# A rank without a stack, by why (`NodeStacks.why`)
NO_STACK = {
    "no-spy": f"no stack: py-spy is not installed there (fix: {PY_SPY_FIX})",
    "denied": "no stack: py-spy may not read it (fix: run as root or with sudo -n, or "
              "sysctl kernel.yama.ptrace_scope=0)",
    "timeout": f"no stack: py-spy did not answer in {SPY_TIMEOUT_S} s (stuck in the kernel?)",
    "ended": "no stack: it ended as it was read",
    "failed": "no stack: py-spy could not read it (its words are in the stacks file)",
    "": "no stack",
}


@dataclass(frozen=True)
class NodeStacks:
    """What a node's look said: its workers found, each rank's py-spy text and why it
    has no stack ("" where read, else a key of NO_STACK); `error` where the node did
    not answer."""

    node: str
    workers: int = 0
    processes: int = 0  # of the job there, workers or not (torchrun before its workers)
    dumps: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    why: Mapping[int, str] = field(default_factory=dict)
    stopped: frozenset[int] = frozenset()  # ranks stopped (SIGSTOP, a debugger) as read
    error: str = ""


def node_stacks(node: str, stdout: str, stderr: str = "") -> NodeStacks:
    """A node's look from its script's lines: `@@gpc workers N PROCESSES`, then a section
    per worker, `stack RANK PID STATE` (its /proc state: T or t, stopped), with py-spy's
    output and exit code."""
    workers, processes = ([*reports.by_kind(stdout).get("workers", [""])[0].split(), "", ""])[:2]
    if not workers.isdigit():
        return NodeStacks(node, error=(stderr or stdout).strip()[-200:] or "no answer")
    dumps, why, stopped = {}, {}, set()
    for name, section in reports.sections(stdout).items():
        kind, rank, _, state = ([*name.split(), "", "", ""])[:4]
        if kind == "stack" and rank.isdigit():
            dumps[int(rank)] = tuple(section.output.splitlines())
            why[int(rank)] = _why(section)
            if state in ("T", "t"):
                stopped.add(int(rank))
    return NodeStacks(node, int(workers), int(processes or 0), dumps, why, frozenset(stopped))


def _why(section: reports.Section) -> str:
    """Why a rank's read gave no stack; "" where it did."""
    text = section.output
    if section.exit_code == 127:
        return "no-spy"
    if section.exit_code == 124:
        return "timeout"
    if section.exit_code == 0 and spy_main_thread(text.splitlines()):
        return ""
    if _DENIED.search(text):
        return "denied"
    return "ended" if _ENDED.search(text) else "failed"


def look(session: Session, inventory: Inventory, record: JobRecord, native: bool
         ) -> dict[str, NodeStacks]:
    """Every node's ranks read at once; a node that cannot be asked, with why."""
    runtimes = record.container_runtime

    def script_on(node: str) -> str | NodeStacks:
        runtime = runtimes.get(node)
        engine = node_scripts.engine_command(runtime) if runtime else None
        if not node_scripts.stacks_reachable(record, engine):
            return NodeStacks(node, error="its container's engine is not recorded (a job "
                                          "an older gpucluster started)")
        return node_scripts.stacks_script(record, node, runtime, native, SPY_TIMEOUT_S)

    return _look_on(session, hosts_of(inventory, record), script_on)


def look_slurm(session: Session, hosts: Sequence[Host], slurm_id: str, native: bool
               ) -> dict[str, NodeStacks]:
    """A Slurm job's ranks on `hosts` (where Slurm runs it), found by its id."""
    return _look_on(session, hosts, lambda node: node_scripts.slurm_stacks_script(
        slurm_id, node, native, SPY_TIMEOUT_S))


def _look_on(session: Session, hosts: Sequence[Host],
             script_on: Callable[[str], str | NodeStacks]) -> dict[str, NodeStacks]:
    def look_on(connection: Connection) -> NodeStacks:
        script = script_on(connection.host)
        if isinstance(script, NodeStacks):
            return script
        result = connection.run(script, timeout=SPY_TIMEOUT_S * 2 + 15)
        return node_stacks(connection.host, result.stdout, result.stderr)

    done = session.map(hosts, look_on)
    looked = dict(done.values)
    for node, failure in done.failures.items():
        looked[node] = NodeStacks(node, error=failure.message)
    return looked


def read(looked: Mapping[str, NodeStacks]) -> tuple[StackGroup, ...]:
    """The ranks grouped by where they are, the largest group first, then those
    without a stack by why. A rank stopped as it was read is said to be: usually the
    one the others wait for."""
    return grouped((rank, node, _place(result, rank), why)
                   for node, result in looked.items() for rank, why in result.why.items())


def _place(result: NodeStacks, rank: int) -> str | None:
    frames = spy_main_thread(result.dumps[rank])
    if result.why[rank] or frames is None:
        return None
    return where(frames) + (STOPPED if rank in result.stopped else "")
