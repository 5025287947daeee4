"""A job's line made safe to print among others: what a terminal takes as a command
(a cursor move, a screen clear, a title, a bell, a backspace) left out; colours kept.

A line is one rank's, shown among every node's, each behind its prefix: a cursor move
up (tqdm draws a bar below another so, then goes back up) makes the next line of the
view overwrite it, and a job's output has no business with the user's terminal. The
node's log and the controller's copy keep every byte."""

from __future__ import annotations

import re

# ECMA-48: a control sequence (ESC [ ... final byte), an operating system command
# (ESC ] ... BEL or ESC \), any other escape, the C0 controls but the tab, and the C1
# controls (0x9b is a control sequence's start to some terminals).
_CONTROLS = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
                       r"|\x1b[ -~]?|[\x00-\x08\x0a-\x1f\x7f-\x9f]")
_COLOUR_END = "m"  # ESC [ ... m sets colours and weight (SGR): kept


def printable(text: str) -> str:
    """`text` without terminal controls but its colours."""
    if text.isprintable():  # nearly every line: no control character in it
        return text
    return _CONTROLS.sub(_kept, text)


def _kept(control: re.Match[str]) -> str:
    found = control.group()
    return found if found.startswith("\x1b[") and found.endswith(_COLOUR_END) else ""
