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
_GLUED = re.compile(r"(\[\d+\]:)?(?=\[rank\d+\]: |Traceback \(most recent call last\):\s*$"
                    r"|([IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ \S+:\d+\] ))")


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
    """The lines a rank's open line and what was glued to it make: its error's (of this
    rank unless the tee's header says another's), or a log line of torchrun's own (no
    rank's, unless the tee's header says so), which it writes beside the tee."""
    # Substrings first: this runs on every line of logs that may be gigabytes.
    if ("] " not in line and "[rank" not in line and TRACEBACK_START not in line) \
            or not line.startswith("["):
        return (line,)
    match = RANK_PREFIX.match(line)
    if match is None:
        return (line,)
    text_at = match.end(1) + 2
    found = _GLUED.search(line, text_at)
    if found is None or found.start() == text_at:
        return (line,)
    rest = line[found.start():]
    if not found.group(1) and not found.group(2):  # its error, within the rank's stream
        rest = f"[{match.group(1)}]:{rest}"
    return (line[:found.start()], *unglued(rest))
