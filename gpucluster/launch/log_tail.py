"""`logs -n N` without -f: each node's last N lines with their stamps and the job's state
there, in one round trip, never its whole log (a job's log may be gigabytes: fetching
it all for `-n 5` took 8 s for 800000 lines on two sandbox nodes)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpucluster import reports
from gpucluster.inventory import Inventory
from gpucluster.launch import node_scripts
from gpucluster.launch.control import hosts_of
from gpucluster.launch.jobs import JobRecord
from gpucluster.launch.logsearch import LogLine, parse_stamp, timed_lines
from gpucluster.launch.model import NodeState, parse_state
from gpucluster.remote.session import Session

TAIL_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class NodeTail:
    state: NodeState
    lines: tuple[LogLine, ...]  # its last lines, oldest first (none when unreachable)
    # Where a follow of the lines after these starts: past them, or at the last one when
    # it is unfinished (a progress bar's \r updates), for the follow to send it whole.
    resume_at: int | None = None
    last_unfinished: bool = False


def fetch(session: Session, inventory: Inventory, record: JobRecord,
          nodes: Sequence[str] | None, last: int) -> dict[str, NodeTail]:
    """Each of the job's nodes (or `nodes`): its last `last` lines and the job's state."""
    hosts = hosts_of(inventory, record, nodes)
    found = session.map(hosts, lambda c: c.run(
        node_scripts.follow_script(record, c.host, follow=False, last_lines=last),
        timeout=TAIL_TIMEOUT_S))
    tails = {}
    for host in hosts:
        failure = found.failures.get(host.name)
        result = found.values.get(host.name)
        if failure is not None or result is None:
            why = failure.message if failure is not None else "no answer"
            tails[host.name] = NodeTail(NodeState(host.name, "unreachable", None, why), ())
        else:
            tails[host.name] = parse_tail(record, host.name, result.stdout)
    return tails


def parse_tail(record: JobRecord, node: str, output: str) -> NodeTail:
    """The script's output: the log's lines, `@@gpc offset RESUME END` (where the lines
    after them begin, and where the log ended), `@@gpc state ...`, `@@gpc times`, then the
    stamps of the last lines. Both are the files' last lines, so they pair from the end
    (on a running job the stamper, 0.2 s behind, gives the newest lines slightly older
    times); lines left without a stamp take the next older one's, else the job's start."""
    texts: list[str] = []
    stamps: list[float] = []
    state = NodeState(node, "lost", None, "the log ended without a state")
    resume_at, end = None, None
    part = "log"
    for line in output.splitlines():
        kind, rest = reports.parse(line) or ("", "")
        if part == "log" and kind == "offset" and (offsets := _offsets(rest)):
            resume_at, end = offsets
        elif part == "log" and kind == "state":
            state, part = parse_state(node, rest), "state"
        elif part == "state" and kind == "times":
            part = "times"
        elif part == "log":
            texts.append(line)
        elif part == "times":
            stamps.append(parse_stamp(line, stamps[-1] if stamps else 0.0))
    own = [0.0] * max(len(texts) - len(stamps), 0) + stamps[-len(texts):] if texts else []
    return NodeTail(state, tuple(timed_lines(record, node, texts, own)), resume_at,
                    resume_at is not None and resume_at != end)


def _offsets(text: str) -> tuple[int, int] | None:
    """`@@gpc offset RESUME END`'s two numbers."""
    parts = text.split()
    if len(parts) == 2 and all(part.isdigit() for part in parts):
        return int(parts[0]), int(parts[1])
    return None
