"""The project's own error types and the exit codes they map to.

Everything a user can cause (bad inventory, missing tools, no root) is raised as a
`GpuclusterError`; the CLI turns it into a one-line message and an exit code. So is an
OSError about a user's file (os_errors.py). Anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

from dataclasses import dataclass

EXIT_OK = 0
EXIT_FAILED = 1  # the command ran, and something on a host failed
EXIT_USAGE = 2  # the run itself could not happen (bad input, missing tool)
EXIT_INTERRUPTED = 130


class GpuclusterError(Exception):
    """A problem the user can fix; `str()` is the whole message to show."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class Problem:
    """One thing wrong in an input file, located and with a fix."""

    path: str
    line: int | None
    message: str
    fix: str = ""

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        fix = f" (fix: {self.fix})" if self.fix else ""
        return f"{where}: {self.message}{fix}"


def split_fix(message: str) -> tuple[str, str | None]:
    """"what is wrong (fix: what to do)" -> its two parts, for a view that shows the fix
    apart; a message without one -> (message, None)."""
    head, marker, fix = message.rpartition(" (fix: ")
    return (head, fix[:-1]) if marker and fix.endswith(")") else (message, None)


class InventoryError(GpuclusterError):
    """The inventory could not be read or is invalid; carries every problem found."""

    def __init__(self, problems: list[Problem]) -> None:
        # In file order, as an editor walks them (the checks run section by section).
        self.problems = sorted(problems, key=lambda p: (p.path, p.line or 0))
        super().__init__("\n".join(str(p) for p in self.problems))


class Interrupted(GpuclusterError):
    """Ctrl-C: the work was stopped and its connections closed."""

    exit_code = EXIT_INTERRUPTED


class SandboxError(GpuclusterError):
    """The local sandbox cluster could not be brought up, inspected or torn down."""


class HostRangeError(GpuclusterError):
    """A host range pattern such as `gpu[01-16]` is malformed: what is wrong, and the fix
    apart, for an inventory's problem list to show each in its place."""

    def __init__(self, reason: str, fix: str) -> None:
        super().__init__(f"{reason} (fix: {fix})")
        self.reason, self.fix = reason, fix
