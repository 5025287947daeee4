"""What went wrong first: the failing rank, its exit code and last lines, from
torchrun's own report in a node's log."""

from __future__ import annotations

import re
import signal
from pathlib import Path

from gpucluster.launch.known_causes import KnownCause, killed_by_sigkill, known_cause
from gpucluster.launch.model import FirstFailure, NodeState

RANK_PREFIX = re.compile(r"^\[(\d+)\]:(.*)$")
FAILURE_TAIL_LINES = 12


def split_rank(line: str) -> tuple[str | None, str]:
    """torchrun's tee prefixes each worker line with its global rank: "[3]:text"."""
    match = RANK_PREFIX.match(line)
    return (match.group(1), match.group(2)) if match else (None, line)


def root_cause(lines: list[str]) -> dict[str, str]:
    """torchrun's "Root Cause (first observed failure)" block: its time, host, rank and
    exitcode fields, as written ("1 (local_rank: 0)"); empty where there is none."""
    root = next((i for i, line in enumerate(lines) if "Root Cause" in line), None)
    fields: dict[str, str] = {}
    for line in lines[root:] if root is not None else []:
        name, colon, value = line.strip().partition(":")
        if colon and name.strip() in ("time", "host", "rank", "exitcode"):
            fields.setdefault(name.strip(), value.strip())
    return fields


def first_traceback(lines: list[str], limit: int = 30) -> list[str]:
    """The first Python traceback, through its exception line (the last lines of a long
    one): where a script's own error shows, before the launchers' reports of it."""
    start = next((i for i, line in enumerate(lines)
                  if line.startswith("Traceback (most recent call last):")), None)
    if start is None:
        return []
    end = next((i for i in range(start + 1, len(lines))
                if lines[i] and not lines[i][0].isspace()), len(lines) - 1)
    block = lines[start:end + 1]
    return block if len(block) <= limit else [block[0], "  ...", *block[-(limit - 2):]]


def failure_of(node: str, state: NodeState, log: Path) -> FirstFailure:
    """Rank, exit code and time of a node's failure, from torchrun's own report (its
    "Root Cause" block) and the end of the node's log."""
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines() \
        if log.exists() else []
    fields = root_cause(lines)
    rank = re.match(r"\d+", fields.get("rank", ""))
    worker = re.match(r"-?\d+", fields.get("exitcode", ""))
    prefix = f"[{rank.group()}]:" if rank else None
    rank_lines = [line[len(prefix):] for line in lines if prefix and line.startswith(prefix)]
    worker_exit = int(worker.group()) if worker else None
    return FirstFailure(node, state, int(rank.group()) if rank else None, state.exit_code,
                        tuple(lines[-FAILURE_TAIL_LINES:]), worker_exit,
                        fields.get("time", ""), tuple(rank_lines[-FAILURE_TAIL_LINES:]),
                        cause_of(node, worker_exit, rank_lines, lines))


def cause_of(node: str, worker_exit: int | None, rank_lines: list[str],
             lines: list[str]) -> KnownCause | None:
    """The failing rank's own words first; then the node's lines that are no rank's (its
    torchrun's: a rendezvous it could not reach), never another rank's, whose errors are
    most often the echo of this one."""
    if worker_exit == -signal.SIGKILL:
        return killed_by_sigkill(node)
    return known_cause(rank_lines, node) or known_cause(
        [line for line in lines if not RANK_PREFIX.match(line)], node)
