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


def unglued(line: str) -> tuple[str, ...]:
    """The lines a rank's open line and what was glued to it make: a line of a rank's
    error (this rank's, unless the tee's header names another) or of torchrun's own log
    (no rank's, unless a header names one: torchrun writes it beside the tee)."""
    # Substrings first: this runs on every line of logs that may be gigabytes.
    if ("] " not in line and "[rank" not in line and TRACEBACK_START not in line) \
            or not line.startswith("["):
        return (line,)
    match = RANK_PREFIX.match(line)
    if match is None:
        return (line,)
    pieces: list[str] = []
    # The piece being cut begins at `begins`, behind `header` where the stream had none;
    # its text at `at`. Positions, not slices: a line may be 1 MiB, cut 100000 times.
    rank, header, begins, at = match.group(1), "", 0, match.end(1) + 2
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
    return (*pieces, header + line[begins:])
