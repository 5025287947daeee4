"""What went wrong first: the failing rank, its exit code and last lines, from
torchrun's own report in a node's log."""

from __future__ import annotations

import re
from pathlib import Path

from gpucluster.launch.model import FirstFailure, NodeState

RANK_PREFIX = re.compile(r"^\[(\d+)\]:(.*)$")
FAILURE_TAIL_LINES = 12


def split_rank(line: str) -> tuple[str | None, str]:
    """torchrun's tee prefixes each worker line with its global rank: "[3]:text"."""
    match = RANK_PREFIX.match(line)
    return (match.group(1), match.group(2)) if match else (None, line)


def failure_of(node: str, state: NodeState, log: Path) -> FirstFailure:
    """Rank, exit code and time of a node's failure, from torchrun's own report (its
    "Root Cause" block) and the end of the node's log."""
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines() \
        if log.exists() else []
    root = next((i for i, line in enumerate(lines) if "Root Cause" in line), None)
    fields: dict[str, str] = {}
    for line in lines[root:] if root is not None else []:
        name, colon, value = line.strip().partition(":")
        if colon and name.strip() in ("time", "rank", "exitcode"):
            fields.setdefault(name.strip(), value.strip())
    rank = re.match(r"\d+", fields.get("rank", ""))
    worker = re.match(r"-?\d+", fields.get("exitcode", ""))
    prefix = f"[{rank.group()}]:" if rank else None
    rank_lines = [line[len(prefix):] for line in lines if prefix and line.startswith(prefix)]
    return FirstFailure(node, state, int(rank.group()) if rank else None, state.exit_code,
                        tuple(lines[-FAILURE_TAIL_LINES:]),
                        int(worker.group()) if worker else None, fields.get("time", ""),
                        tuple(rank_lines[-FAILURE_TAIL_LINES:]))
