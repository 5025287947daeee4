"""Where each rank was when a hang was stopped. The stop of a hung job aborts each worker
first (templates/launch/stop.sh), and Python's faulthandler, which start turns on
(PYTHONFAULTHANDLER), writes its threads' stacks into the rank's log as it dies:

    [3]:Fatal Python error: Aborted
    [3]:
    [3]:Current thread 0x00007f8767d59b80 (most recent call first):
    [3]:  File "/srv/gpucluster/proj/train.py", line 128 in main
    [3]:  File "/srv/gpucluster/proj/train.py", line 146 in <module>

Ranks that stopped at the same place share a line; the one elsewhere, or without a
stack (a rank that did not die of the abort: stopped, or stuck in the kernel), is
usually the one to look at."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from gpucluster.hostrange import spans
from gpucluster.launch.jobs import JobRecord, JobStore
from gpucluster.launch.logsearch import LogLine, node_lines

ABORTED = "Fatal Python error: Aborted"
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):")
_FRAME = re.compile(r'^  File "(?P<path>.*)", line (?P<line>\d+) in (?P<function>.*)$')
_PACKAGES = re.compile(r".*/(?:site|dist)-packages/")


@dataclass(frozen=True)
class Frame:
    path: str
    line: int
    function: str


@dataclass(frozen=True)
class StackGroup:
    """Ranks that stopped at the same place (`where`), or, with `where` None, without a
    stack; `nodes`: where they ran, as far as their lines tell."""

    ranks: tuple[int, ...]
    where: str | None
    nodes: tuple[str, ...]


def main_threads(lines: Iterable[LogLine]) -> dict[int, tuple[Frame, ...]]:
    """Each rank's main thread's frames at its abort, innermost first: the thread whose
    outermost frame is the script's `<module>` (else the one the signal landed in)."""
    threads: dict[int, list[tuple[bool, list[Frame]]]] = {}
    open_ranks: set[int] = set()
    for line in lines:
        if line.rank is None:
            continue
        if line.text == ABORTED:
            threads[line.rank] = []
            open_ranks.add(line.rank)
        elif line.rank in open_ranks:
            if (header := _THREAD.match(line.text)) is not None:
                threads[line.rank].append((header[1] == "Current thread", []))
            elif (frame := _FRAME.match(line.text)) is not None and threads[line.rank]:
                threads[line.rank][-1][1].append(
                    Frame(frame["path"], int(frame["line"]), frame["function"]))
            elif line.text.startswith("Extension modules:"):
                open_ranks.discard(line.rank)  # the dump's last line
    chosen = {}
    for rank, dumped in threads.items():
        main = [frames for _, frames in dumped if frames and frames[-1].function == "<module>"]
        current = [frames for is_current, frames in dumped if is_current and frames]
        if main or current:
            chosen[rank] = tuple((main or current)[0])
    return chosen


def where(frames: tuple[Frame, ...], code_dir: str) -> str:
    """`train.py line 128 in main, in backward (torch/_tensor.py line 623)`: the
    innermost frame of the job's own code, then the innermost of all where that is
    another (what the rank was waiting in)."""
    own = next((f for f in frames if f.path.startswith(code_dir.rstrip("/") + "/")), None)
    innermost = frames[0]
    if own is None:
        return _frame_text(innermost, code_dir)
    said = _frame_text(own, code_dir)
    if innermost is not own:
        said += f", in {innermost.function} ({_short(innermost.path, code_dir)} line " \
                f"{innermost.line})"
    return said


def _frame_text(frame: Frame, code_dir: str) -> str:
    return f"{_short(frame.path, code_dir)} line {frame.line} in {frame.function}"


def _short(path: str, code_dir: str) -> str:
    """A path as a reader places it: the job's files from its code dir, a package's from
    its site-packages."""
    prefix = code_dir.rstrip("/") + "/"
    return path[len(prefix):] if path.startswith(prefix) else _PACKAGES.sub("", path)


def read(store: JobStore, record: JobRecord) -> tuple[StackGroup, ...]:
    """From the controller's copies of the job's logs: the ranks grouped by where they
    stopped, the largest group first, then those without a stack. Empty where no rank
    left one (a job in a container, faulthandler turned off): nothing to compare."""
    stacks: dict[int, tuple[Frame, ...]] = {}
    rank_nodes: dict[int, str] = {}
    for node in record.hosts:
        lines = list(node_lines(store, record, node))
        rank_nodes.update((line.rank, node) for line in lines if line.rank is not None)
        stacks.update(main_threads(lines))
    if not stacks:
        return ()
    world = sum(record.nproc_per_node.get(node, 0) for node in record.hosts)
    places: dict[str | None, list[int]] = {}
    for rank in range(max(world, max(rank_nodes, default=-1) + 1)):
        frames = stacks.get(rank)
        places.setdefault(where(frames, record.code_dir) if frames else None, []).append(rank)
    ordered = sorted(places.items(), key=lambda item: (item[0] is None, -len(item[1])))
    return tuple(StackGroup(tuple(ranks), place, tuple(dict.fromkeys(
        rank_nodes[r] for r in ranks if r in rank_nodes))) for place, ranks in ordered)


def said(groups: tuple[StackGroup, ...], job: str) -> list[str]:
    """The lines that tell it, each group's ranks by number (and node where few)."""
    if not groups:
        return []
    lines = [f"where each rank was when the hang was stopped (its whole stack: gpucluster "
             f"logs {job} --rank R):"]
    for group in groups:
        ranks = f"{'rank' if len(group.ranks) == 1 else 'ranks'} {spans(list(group.ranks))}"
        if group.nodes and len(group.nodes) <= 2:
            ranks += f" ({', '.join(group.nodes)})"
        lines.append(f"  {ranks}: " + (group.where or "no stack: it did not die of SIGABRT "
                                       "(stopped, or stuck in the kernel or a driver call)"))
    return lines
