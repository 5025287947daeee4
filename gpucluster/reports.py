"""The one format in which scripts on nodes report to the controller.

Every report is a line `@@gpc KIND [FIELDS...]` among the script's other output:
`@@gpc started 4242`, `@@gpc state exited 0 1700000000.1`, `@@gpc alive`,
`@@gpc loaded node2 IMAGE_ID`, `@@gpc progress node2 1048576`. Multi-line output comes
in sections, `@@gpc section NAME` ... `@@gpc end EXIT_CODE` (the doctor probe, the work
dir listing). Doctor's probe, launch's node scripts, the work-dir sync and the image
relay all write this format, and this module alone reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

MARK = "@@gpc"
_PREFIX = MARK + " "


@dataclass(frozen=True)
class Section:
    output: str
    exit_code: int


def parse(line: str) -> tuple[str, str] | None:
    """(kind, the rest of the line) for a report line; None for any other line."""
    if not line.startswith(_PREFIX):
        return None
    kind, _, rest = line[len(_PREFIX):].partition(" ")
    return (kind, rest) if kind else None


def by_kind(output: str) -> Mapping[str, list[str]]:
    """Every report line of `output`, grouped by kind, in order."""
    found: dict[str, list[str]] = {}
    for line in output.splitlines():
        parsed = parse(line)
        if parsed is not None:
            found.setdefault(parsed[0], []).append(parsed[1])
    return found


def sections(output: str) -> dict[str, Section]:
    """Each `section NAME` ... `end CODE` block; one cut off before its end is left out."""
    found: dict[str, Section] = {}
    name: str | None = None
    lines: list[str] = []
    for line in output.splitlines():
        parsed = parse(line)
        if parsed is not None and parsed[0] == "section":
            name, lines = parsed[1], []
        elif parsed is not None and parsed[0] == "end" and name is not None \
                and parsed[1].lstrip("-").isdigit():
            found[name] = Section("\n".join(lines).strip("\n"), int(parsed[1]))
            name = None
        elif name is not None:
            lines.append(line)
    return found
