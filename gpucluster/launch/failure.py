"""What went wrong first: the failing rank, its exit code and last lines, from
torchrun's own report in a node's log."""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable
from pathlib import Path

from gpucluster.launch.known_causes import (
    KnownCause,
    error_lines,
    killed_by_sigkill,
    known_cause,
)
from gpucluster.launch.model import FirstFailure, NodeState
from gpucluster.launch.tee_lines import (
    RANK_PREFIX,
    TRACEBACK_START,
    rejoined,
    split_rank,
    unglued,
)

FAILURE_TAIL_LINES = 12
SUMMARY_CHARS = 160  # of the error line in_a_line quotes: a line of the jobs table
# torch's prefix on a rank's uncaught error, searched, not anchored: torchrun copies a
# rank's stdout and stderr apart, so a line of its stdout not yet ended may come first.
_TORCH_PREFIX = re.compile(r"\[rank\d+\]: ?")
_TRACEBACK = re.compile(r"(\[rank\d+\]: ?)?(Traceback \(most recent call last\):)\s*$")


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
    start = next((i for i, line in enumerate(lines) if line.startswith(TRACEBACK_START)),
                 None)
    return [] if start is None else _traceback_at(lines, start, limit)


def last_traceback(rank_lines: list[str], limit: int = FAILURE_TAIL_LINES) -> list[str]:
    """A rank's last Python traceback, through its exception line, without torch's
    "[rankN]: " prefix: most often what it died of, wherever it stands. torchrun copies a
    rank's stdout and stderr into the log apart, so a rank that printed fast left its
    last output after its traceback (11000 lines after, for 15 MB printed)."""
    for start in range(len(rank_lines) - 1, -1, -1):
        line = rank_lines[start]  # the substring first: a regex per line of 100000 is slow
        if TRACEBACK_START in line and (found := _TRACEBACK.search(line)) is not None:
            break
    else:
        return []
    # With torch's prefix, the lines without it are the rank's stdout, copied in between.
    prefixed = found.group(1) is not None
    block = [found.group(2)]
    for line in rank_lines[start + 1:]:
        prefix = _TORCH_PREFIX.search(line) if prefixed else None
        if prefixed and prefix is None:
            continue
        text = line[prefix.end():] if prefix is not None else line
        block.append(text)
        if text and not text[0].isspace():
            break  # its exception line
    return _traceback_at(block, 0, limit)


def _traceback_at(lines: list[str], start: int, limit: int) -> list[str]:
    end = next((i for i in range(start + 1, len(lines))
                if lines[i] and not lines[i][0].isspace()), len(lines) - 1)
    block = lines[start:end + 1]
    return block if len(block) <= limit else [block[0], "  ...", *block[-(limit - 2):]]


def failure_of(node: str, state: NodeState, log: Path) -> FirstFailure:
    """Rank, exit code and time of a node's failure, from torchrun's own report (its
    "Root Cause" block) and the end of the node's log."""
    return failure_in(node, state, log.read_text(encoding="utf-8", errors="replace")
                      .splitlines() if log.exists() else [])


def failure_in(node: str, state: NodeState, node_lines: Iterable[str]) -> FirstFailure:
    """failure_of's, from the node's lines as its log has them (torchrun's tee's)."""
    lines = [piece for line in node_lines for piece in unglued(line)]
    fields = root_cause(lines)
    rank = re.match(r"\d+", fields.get("rank", ""))
    worker = re.match(r"-?\d+", fields.get("exitcode", ""))
    prefix = f"[{rank.group()}]:" if rank else None
    rank_lines = rejoined([split_rank(line)[1] for line in lines
                           if prefix and line.startswith(prefix)])
    worker_exit = int(worker.group()) if worker else None
    # A rank killed by a signal printed no error: a traceback of its is one it lived on after.
    error = last_traceback(rank_lines) if worker_exit is None or worker_exit > 0 else []
    return FirstFailure(node, state, int(rank.group()) if rank else None, state.exit_code,
                        tuple(lines[-FAILURE_TAIL_LINES:]), worker_exit,
                        fields.get("time", ""), tuple(rank_lines[-FAILURE_TAIL_LINES:]),
                        cause_of(node, worker_exit, [*rank_lines, *error], lines,
                                 state.exit_code),
                        tuple(error))


def cause_of(node: str, worker_exit: int | None, rank_lines: list[str],
             lines: list[str], node_exit: int | None = None) -> KnownCause | None:
    """The failing rank's own words first (its last traceback after them, so that the
    end searched holds it); then the node's lines that are no rank's (its torchrun's: a
    rendezvous it could not reach), never another rank's, whose errors are most often
    the echo of this one. torchrun itself killed (exit 137, no worker's report: it had
    no time to write one) is the OOM killer's mark as a worker's -9 is."""
    if worker_exit == -signal.SIGKILL:
        return killed_by_sigkill(node)
    if worker_exit is None and node_exit == 128 + signal.SIGKILL:
        return killed_by_sigkill(node, "torchrun")
    return known_cause(rank_lines, node) or known_cause(
        [line for line in lines if not RANK_PREFIX.match(line)], node)


def in_a_line(failure: FirstFailure) -> str:
    """`rank 1 on node2: the GPU ran out of memory`: where, and its likely cause, else
    its last error line, else how its worker ended (`worker exit code 7`: a
    sys.exit without a word), else how its node ended."""
    where = f"rank {failure.rank} on {failure.node}" if failure.rank is not None \
        else failure.node
    errors = error_lines(failure.rank_error or failure.rank_tail)
    worker = (f"worker killed by {failure.killing_signal}" if failure.killing_signal
              else f"worker exit code {failure.worker_exit}"
              if failure.worker_exit is not None else None)
    why = failure.cause.what if failure.cause is not None else (
        errors[-1] if errors else worker or failure.state.label)
    return f"{where}: {why[:SUMMARY_CHARS]}"
