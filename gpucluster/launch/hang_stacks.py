"""Where each rank was when a hang was stopped. The stop of a hung job aborts each worker
first (templates/launch/stop.sh), and Python's faulthandler, which start turns on
(PYTHONFAULTHANDLER), writes its threads' stacks to the rank's stderr as it dies; the
stop reports each dump from the rank's own file:

    Fatal Python error: Aborted

    Current thread 0x00007f8767d59b80 (most recent call first):
      File "/srv/gpucluster/proj/train.py", line 128 in main
      File "/srv/gpucluster/proj/train.py", line 146 in <module>

Ranks that stopped at the same place share a line; the one elsewhere, or without a
stack (a rank that did not die of the abort: stopped, or stuck in the kernel), is
usually the one to look at. The stop says how each rank without a stack ended (`why`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucluster.launch.model import StopResult
from gpucluster.wording import ranks_named

ABORTED = "Fatal Python error: Aborted"
STACKS_FILE = "stacks.txt"  # in the job's directory here, by write()
STACKS_FILES = "stacks*.txt"  # that, and each live look's (live_stacks: stacks-TIME.txt)
# faulthandler's dump after its first line: blank lines, a header per thread, its frames
# (or `<no Python frame>`), then the extension modules loaded, its last line (DUMP_END).
_THREAD = re.compile(r"(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):")
_FRAME = re.compile(r'  File "(?P<path>.*)", line (?P<line>\d+) in (?P<function>.*)$')
DUMP_END = re.compile(r"Extension modules: ")
DUMP_LINE = re.compile(rf"$|{_THREAD.pattern}|  File \"|  <no Python frame>|{DUMP_END.pattern}")
# py-spy's dump (--full-filenames): a header per thread, its frames innermost first; with
# --native, C and C++ frames among them, a library in place of file and line:
#     Thread 23719 (idle): "MainThread"
#         _engine_run_backward (/venv/lib/python3.11/site-packages/torch/autograd/graph.py:829)
#         main (/srv/gpucluster/proj/train.py:128)
_SPY_THREAD = re.compile(r'Thread (?:0x[0-9A-Fa-f]+|\d+) \([^)]*\)(?:: "(?P<name>.*)")?$')
_SPY_FRAME = re.compile(r"    (?P<function>\S.*?) \((?P<path>.+?)(?::(?P<line>\d+))?\)$")
_PACKAGES = re.compile(r".*/(?:site|dist)-packages/")
_SYSTEM_LIBRARY = re.compile(r"(?:/usr)?/lib(?:64)?/(?:[^/]+/)?(?:libc|libpthread|libstdc\+\+)[.-]")
# A rank without a stack, by how the stop saw it end (stop.sh's fate; "" where it did not say)
# A rank read by py-spy, by why it wrote no stack of its own
_READ_BY_SPY = {
    "stopped": "it was stopped: SIGSTOP, a debugger",
    "alive": "still alive 3 s after the abort: stuck in the kernel or a driver call",
    "died": "it died without writing a stack",
    "": "it wrote no stack",
}
_NO_STACK = {
    "stopped": "no stack: it was stopped (SIGSTOP, a debugger) and could not take the abort",
    "alive": "no stack: still alive 3 s after the abort (stuck in the kernel or a driver "
             "call)",
    "died": "no stack: it died without writing one (of another signal, or with "
            "faulthandler off)",
    "": "no stack: it did not die of SIGABRT (stopped, or stuck in the kernel or a driver "
        "call)",
}


@dataclass(frozen=True)
class Frame:
    path: str
    line: int  # 0: a native frame's, which names its library alone
    function: str


@dataclass(frozen=True)
class StackGroup:
    """Ranks that stopped at the same place (`where`), or, with `where` None, without a
    stack; `why` they wrote none of their own (stopped, alive, died; "" unsaid), also
    where py-spy read them; `nodes`: where they ran, as their nodes' stops reported
    them."""

    ranks: tuple[int, ...]
    where: str | None
    nodes: tuple[str, ...]
    why: str | None = None


def main_thread(dump: Sequence[str]) -> tuple[Frame, ...] | None:
    """A rank's main thread's frames in its dump, innermost first: the thread whose
    outermost frame is the script's `<module>` (else the one the signal landed in);
    None for no dump."""
    threads: list[tuple[bool, list[Frame]]] = []
    for text in dump:
        if (header := _THREAD.match(text)) is not None:
            threads.append((header[1] == "Current thread", []))
        elif (frame := _FRAME.match(text)) is not None and threads:
            threads[-1][1].append(Frame(frame["path"], int(frame["line"]), frame["function"]))
        elif DUMP_END.match(text):
            break
    main = [frames for _, frames in threads if frames and frames[-1].function == "<module>"]
    current = [frames for is_current, frames in threads if is_current and frames]
    return tuple((main or current)[0]) if main or current else None


def spy_main_thread(dump: Sequence[str]) -> tuple[Frame, ...] | None:
    """The main thread's frames in py-spy's dump, innermost first: the thread named
    MainThread, else the one whose outermost frame is a `<module>`, else the first; None
    for none (py-spy's error)."""
    threads: list[tuple[str, list[Frame]]] = []
    for text in dump:
        if (header := _SPY_THREAD.match(text)) is not None:
            threads.append((header["name"] or "", []))
        elif threads and (frame := _SPY_FRAME.match(text)) is not None:
            threads[-1][1].append(Frame(frame["path"], int(frame["line"] or 0),
                                        frame["function"]))
    named = [frames for name, frames in threads if name == "MainThread" and frames]
    module = [frames for _, frames in threads if frames and frames[-1].function == "<module>"]
    first = [frames for _, frames in threads if frames]
    return tuple((named or module or first)[0]) if first else None


def where(frames: tuple[Frame, ...]) -> str:
    """`train.py line 128 in main, in backward (torch/_tensor.py line 623)`: the
    innermost frame of the job's own code (beside its script, or below), then the
    innermost of all where that is another (what the rank was waiting in)."""
    code_dir = _script_dir(frames)
    own = next((f for f in frames if f.path.startswith(code_dir)), None)
    innermost = next((f for f in frames if not _system(f)), frames[0])
    if own is None:
        return _frame_text(innermost, code_dir)
    said = _frame_text(own, code_dir)
    if innermost is not own:
        said += f", in {innermost.function} ({_place(innermost, code_dir)})"
    return said


def _system(frame: Frame) -> bool:
    """A native frame (py-spy --native) that says nothing of where the rank waits: one
    py-spy could not name (`0x7fe38091ff16`: ranks in one place would split by the
    address they were read at), or in the C library or the C++ runtime, where every wait
    ends (`pthread_cond_wait`), below the frame that says what it waits for
    (`c10d::Reducer::finalize_backward`)."""
    return not frame.line and (frame.function.startswith("0x")
                               or _SYSTEM_LIBRARY.match(frame.path) is not None)


def _script_dir(frames: tuple[Frame, ...]) -> str:
    """`/srv/proj/`: the directory of the script the main thread began in (its outermost
    `<module>` that is a file, runpy's being `<frozen runpy>`). The job record's code dir
    may be a shell expression (`"$HOME"/gpucluster/proj`) that only the node expands.
    Without a script file (`python -c`), a string no path starts with."""
    script = next((f for f in reversed(frames)
                   if f.function == "<module>" and not f.path.startswith("<")), None)
    return script.path.rsplit("/", 1)[0] + "/" if script and "/" in script.path else "\0"


def _frame_text(frame: Frame, code_dir: str) -> str:
    if not frame.line:  # a native frame (py-spy --native): its library
        return f"{frame.function} ({_place(frame, code_dir)})"
    return f"{_place(frame, code_dir)} in {frame.function}"


def _place(frame: Frame, code_dir: str) -> str:
    """`torch/_tensor.py line 623`; a native frame's library alone, by its name."""
    if not frame.line:
        return frame.path.rsplit("/", 1)[-1]
    return f"{_short(frame.path, code_dir)} line {frame.line}"


def _short(path: str, code_dir: str) -> str:
    """A path as a reader places it: the job's files from its script's dir, a
    package's from its site-packages."""
    return path.removeprefix(code_dir) if path.startswith(code_dir) else _PACKAGES.sub("", path)


def read(stopped: Mapping[str, StopResult]) -> tuple[StackGroup, ...]:
    """From the stop's reports (each node's aborted ranks and their dumps): the ranks
    grouped by where they stopped, the largest group first, then those without a stack.
    Empty where no rank left one (faulthandler turned off, and no py-spy on the nodes):
    nothing to compare."""
    groups = grouped((rank, node, *_rank_place(result, rank))
                     for node, result in stopped.items() for rank in result.stacks)
    return groups if any(group.where for group in groups) else ()


def _rank_place(result: StopResult, rank: int) -> tuple[str | None, str]:
    """Where the rank's own dump says it was; else where py-spy read it before the
    abort, said so, with why it wrote none; else None and why."""
    if frames := main_thread(result.stacks[rank]):
        return where(frames), ""
    fate = _known(result.stack_fates.get(rank, ""))
    if frames := spy_main_thread(result.spied.get(rank, ())):
        return f"{where(frames)} ({_READ_BY_SPY[fate]}; read by py-spy)", fate
    return None, fate


def kept_dumps(stopped: Mapping[str, StopResult]) -> dict[str, dict[int, tuple[str, ...]]]:
    """Each rank's dump for write(): its own, else py-spy's read of it."""
    return {node: {rank: dump or result.spied.get(rank, ()) for rank, dump
                   in result.stacks.items()} for node, result in stopped.items()}


def grouped(ranks: Iterable[tuple[int, str, str | None, str]]) -> tuple[StackGroup, ...]:
    """Each (rank, node, where it is or None, why it has no stack of its own: "" where it
    has) grouped by where and why, the largest group first, then those without a stack."""
    places: dict[tuple[str | None, str | None], list[tuple[int, str]]] = {}
    for rank, node, place_of_rank, why in ranks:
        place = (place_of_rank, why or None) if place_of_rank else (None, why)
        places.setdefault(place, []).append((rank, node))
    ordered = sorted(places.items(), key=lambda item: (item[0][0] is None, -len(item[1]),
                                                       min(item[1])))
    return tuple(StackGroup(tuple(sorted(rank for rank, _ in members)), place,
                            tuple(dict.fromkeys(node for _, node in sorted(members))), why)
                 for (place, why), members in ordered)


def _known(fate: str) -> str:
    return fate if fate in _NO_STACK else ""


def write(directory: Path, dumps_by_node: Mapping[str, Mapping[int, Sequence[str]]],
          name: str = STACKS_FILE) -> Path:
    """Every rank's whole dump, rank by rank, into `directory`/`name` (the job's
    directory here): the node's log may have lost lines of it (torchrun's tee)."""
    dumps = sorted((rank, node, dump) for node, by_rank in dumps_by_node.items()
                   for rank, dump in by_rank.items())
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("".join(
        f"== rank {rank} on {node}" + ("" if dump else ": no stack") + " ==\n"
        + "".join(f"{line}\n" for line in dump) + "\n" for rank, node, dump in dumps),
        encoding="utf-8")
    return path


def said(groups: tuple[StackGroup, ...], kept: Path,
         heading: str = "where each rank was when the hang was stopped",
         no_stack: Mapping[str, str] = _NO_STACK) -> list[str]:
    """The lines that tell it, each group's ranks by number (and node where few);
    `kept`: the file with every rank's whole stack; `no_stack`: what a rank without one
    is said to be, by its why."""
    if not groups:
        return []
    lines = [f"{heading} (each rank's whole stack: {kept}):"]
    for group in groups:
        ranks = ranks_named(group.ranks)
        if group.nodes and len(group.nodes) <= 2:
            ranks += f" ({', '.join(group.nodes)})"
        lines.append(f"  {ranks}: " + (group.where or no_stack[group.why or ""]))
    return lines


def payload(groups: tuple[StackGroup, ...]) -> list[dict[str, Any]]:
    """As --json has them: `where` null for the ranks without a stack, and `why` they
    wrote none (stopped, alive, died; "" unsaid), also for those py-spy read; null for
    the others."""
    return [{"ranks": list(g.ranks), "where": g.where, "nodes": list(g.nodes), "why": g.why}
            for g in groups]
