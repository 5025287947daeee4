"""A node's log as torchrun's tee writes it: each worker's line behind its global rank,
"[3]:text", and what becomes of a line a rank left open (a progress bar): the tee writes
it as it stands, so whatever is written next is glued to it."""

from __future__ import annotations

import re

RANK_PREFIX = re.compile(r"^\[(\d+)\]:(.*)$")
TRACEBACK_START = "Traceback (most recent call last):"
# The start of a line glued to a rank's open line, behind the header of the rank it is
# from where the tee put one there: a line of a rank's error, as torch prefixes each
# ("[rank3]: "), a traceback's first line, or a line of torch's own log ("W1205
# 21:22:29.007000 32415 api.py:753] ").
_GLUED = re.compile(r"(?P<header>\[\d+\]:)?(?=(?P<start>\[rank\d+\]: "
                    r"|Traceback \(most recent call last\):\s*$"
                    r"|(?P<torch_log>[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ \S+:\d+\] )))")


def split_rank(line: str) -> tuple[str | None, str]:
    """The rank a line is from (None: torchrun's own) and its text."""
    match = RANK_PREFIX.match(line)
    if match is None:
        return None, line
    rank, text = match.groups()
    # The tee reads a rank's output a line at a time as it grows: a line still open (a
    # progress bar, redrawn after a \r) is written as it stands, and the \r that ends it
    # comes next as an empty line of its own, "[3]:bar 40%" glued to that "[3]:".
    return rank, text.removesuffix(f"[{rank}]:")


def ranked(line: str) -> list[tuple[str | None, str]]:
    """The lines one line of a node's log shows as, each as its rank and its text."""
    if _plain(line):  # nearly every line: no call to unglued
        return [split_rank(line)]
    return [split_rank(piece) for piece in unglued(line)]


def _plain(line: str) -> bool:
    """Nothing is glued to it: a cut begins at a "]" past the rank's header's, or at a
    traceback. Substrings only: this runs on every line of logs that may be gigabytes."""
    return line.count("]") < 2 and TRACEBACK_START not in line


def unglued(line: str) -> tuple[str, ...]:
    """The lines a rank's open line and what was glued to it make: the rank's next line
    (its own header glued on: a print while its progress bar was open), a line of a
    rank's error (this rank's, unless the tee's header names another) or of torchrun's
    own log (no rank's, unless a header names one: torchrun writes it beside the tee)."""
    if _plain(line):
        return (line,)
    match = RANK_PREFIX.match(line)
    if match is None:
        return (line,)
    return tuple(piece for part in _own_lines(line, f"[{match.group(1)}]:")
                 for piece in _cut_glued(part, match.group(1)))


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
