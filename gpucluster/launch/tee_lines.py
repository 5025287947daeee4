"""A node's log as torchrun's tee writes it: each worker's line behind its global rank,
"[3]:text", and what becomes of a line a rank left open (a progress bar): the tee writes
it as it stands, so whatever is written next is glued to it."""

from __future__ import annotations

import re
from typing import NamedTuple

RANK_PREFIX = re.compile(r"^\[(\d+)\]:(.*)$")
TRACEBACK_START = "Traceback (most recent call last):"
# The start of a line glued to a rank's open line, behind the header of the rank it is
# from where the tee put one there: a line of a rank's error, as torch prefixes each
# ("[rank3]: "), a traceback's first line, or a line of torch's own log ("W1205
# 21:22:29.007000 32415 api.py:753] ").
_GLUED = re.compile(r"(?P<header>\[\d+\]:)?(?=(?P<start>\[rank\d+\]: "
                    r"|Traceback \(most recent call last\):\s*$"
                    r"|(?P<torch_log>[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ \S+:\d+\] )))")
# Where a line of torch's log glued on ends its header: its file and line.
_TORCH_LOG_AT = re.compile(r":\d+\] ")
# Another rank's header ending a line, right behind its text: that rank's empty line (the
# \r ending its bar's draw), written while this rank's draw was open.
_HEADER_AT_END = re.compile(r"(?<=\S)\[(\d+)\]:$")


# An exception's type as Python prints it before its message: `OSError`,
# `torch.OutOfMemoryError`, `mypkg.errors.ShardMissing` (a module's own types by name).
_EXCEPTION_TYPE = r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Warning|Fault)"
_CUT_TYPE = re.compile(_EXCEPTION_TYPE)
_CUT_AFTER_COLON = re.compile(_EXCEPTION_TYPE + ": ")


def rejoined(lines: list[str]) -> list[str]:
    """A rank's lines with its exception line whole again. Python writes an exception's
    type, `: ` and its message apart (unbuffered, as launch runs the ranks), and the tee,
    reading the rank's file as it grows, may write what it found so far as a line: a CI
    run's rank 2 ended `OSError`, then `: [Errno 122] Disk quota exceeded: ...`, and its
    error read as `OSError`."""
    whole: list[str] = []
    for line in lines:
        if whole and ((line.startswith(": ") and _CUT_TYPE.fullmatch(whole[-1]))
                      or _CUT_AFTER_COLON.fullmatch(whole[-1])):
            whole[-1] += line
        else:
            whole.append(line)
    return whole


class FailureSummary:
    """One node's torchrun failure summary, which numbers each failure "[0]:" on a line of
    its own, as its tee heads a rank's empty line: inside the summary (from its
    "Failures:" to its closing border), such a line is torchrun's, not rank 0's."""

    def __init__(self) -> None:
        self._inside = False

    def own(self, rank: str | None, text: str) -> tuple[str | None, str]:
        """The line's rank and text, a number of the summary's given back to torchrun."""
        if rank is None:
            if text == "Failures:":
                self._inside = True
            elif text.startswith("="):  # the summary's closing border
                self._inside = False
        elif not text and self._inside:
            return None, f"[{rank}]:"
        return rank, text


class Piece(NamedTuple):
    """A line as a log line shows it: its rank (None: torchrun's own), its text, and
    whether the tee wrote it before the rank had ended it (`drawn`: a progress bar's
    draw), then whatever ended it (\\r, \\n) not yet (`ends_later`, an empty line of the
    rank to come: the rank's next write came first, glued on)."""

    rank: str | None
    text: str
    drawn: bool = False
    ends_later: bool = False


def split_rank(line: str) -> tuple[str | None, str]:
    """The rank a line is from (None: torchrun's own) and its text."""
    rank, text, _ = _split(line)
    return rank, text


def _split(line: str) -> tuple[str | None, str, bool]:
    """split_rank's, and whether the line was a draw the tee ended within the line."""
    match = RANK_PREFIX.match(line)
    if match is None:
        return None, line, False
    rank, text = match.groups()
    # The tee reads a rank's output a line at a time as it grows: a line still open (a
    # progress bar, redrawn after a \r) is written as it stands, and the \r that ends it
    # comes next as an empty line of its own, "[3]:bar 40%" glued to that "[3]:".
    header = f"[{rank}]:"
    if text.endswith(header):
        return rank, text[:-len(header)], True
    return rank, text, False


def ranked(line: str) -> list[Piece]:
    """The lines one line of a node's log shows as."""
    if _plain(line):  # nearly every line: no call to unglued, no header at its end
        match = RANK_PREFIX.match(line)
        return [Piece(None, line) if match is None else Piece(match[1], match[2])]
    pieces = unglued(line)
    last = len(pieces) - 1
    # Each piece but the last was cut off by the next write: open until its end comes.
    return [Piece(rank, text, drawn or at < last, at < last)
            for at, (rank, text, drawn) in enumerate(map(_split, pieces))]


def _plain(line: str) -> bool:
    """Nothing is glued to it: a cut begins at a rank's header past the line's own ("]:":
    the tee's "[3]:", torch's "[rank3]: "), at a torch log line's file and line
    ("api.py:753] ") or at a traceback. Substrings first: this runs on every line of
    logs that may be gigabytes, and each draw of a tqdm bar has a "]" of its own."""
    if TRACEBACK_START in line:
        return False
    return line.count("]") < 2 or (
        line.count("]:") < 2 and _TORCH_LOG_AT.search(line) is None)


def unglued(line: str) -> tuple[str, ...]:
    """The lines a rank's open line and what was glued to it make: the rank's next line
    (its own header glued on: a print while its progress bar was open), a line of a
    rank's error (this rank's, unless the tee's header names another) or of torchrun's
    own log (no rank's, unless a header names one: torchrun writes it beside the tee),
    another rank's empty line at its end (two ranks' bars drawn at once)."""
    if _plain(line):
        return (line,)
    match = RANK_PREFIX.match(line)
    if match is None:
        return (line,)
    pieces = [piece for part in _own_lines(line, f"[{match.group(1)}]:")
              for piece in _cut_glued(part, match.group(1))]
    last = pieces[-1]
    end = _HEADER_AT_END.search(last, last.find(":") + 2)  # behind a character of text
    if end is not None and end.group(1) != match.group(1):  # its own: split_rank's to drop
        pieces[-1:] = [last[:end.start()], end.group()]
    return tuple(pieces)


def _own_lines(line: str, header: str) -> list[str]:
    """The line cut where the rank's own header comes again inside it: the tee's start
    of the rank's next write, after one it left open. Not where the header begins the
    text or ends the line (split_rank drops it there: a bar's redraw), nor behind a
    space: "[0]: loss" and "Epoch [0]: loss" are a rank's own words."""
    parts, begins = [], 0
    at = line.find(header, len(header))
    while at != -1:
        if len(header) < at < len(line) - len(header) and not line[at - 1].isspace():
            parts.append(line[begins:at])
            begins = at
        at = line.find(header, at + len(header))
    return [*parts, line[begins:]]


def _cut_glued(line: str, rank: str) -> list[str]:
    """One of the rank's lines cut where a line of an error or of torch's log begins."""
    pieces: list[str] = []
    # The piece being cut begins at `begins`, behind `header` where the stream had none;
    # its text at `at`. Positions, not slices: a line may be 1 MiB, cut 100000 times.
    header, begins, at = "", 0, len(rank) + 3
    while (found := _GLUED.search(line, at)) is not None:
        if found.start() == at and not found.group("header"):
            at += len(found.group("start"))  # what the text begins with is no glue
            continue
        pieces.append(header + line[begins:found.start()])
        begins = found.start()
        if found.group("torch_log"):  # torchrun's own line, to the end
            header = ""
            break
        if found.group("header"):
            rank, header, at = found.group("header")[1:-2], "", found.end("header")
        else:  # a line of the rank's error, within its stream
            header, at = f"[{rank}]:", found.start()
    return [*pieces, header + line[begins:]]
