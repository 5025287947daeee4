"""Values that come back from hosts: command results and typed per-host failures."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

# paramiko's exit status when none came: the connection was lost (the SSH layer raises
# for that), or sshd sent exit-signal instead, so in a CommandResult a signal ended the
# command (its name in `signal`, see exit_signal.py).
NO_EXIT_STATUS = -1
SUDO_N_REFUSAL = "a password is required"  # what sudo -n says where a rule asks one


@dataclass(frozen=True)
class CommandResult:
    """A command that ran to completion; a non-zero exit code is data, not an error."""

    host: str
    command: str
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    signal: str | None = None  # what ended it, as sshd names it (KILL, SEGV), if a signal did

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def killed(self) -> bool:
        """A signal ended it: there is no exit code."""
        return self.signal is not None or self.exit_code == NO_EXIT_STATUS

    @property
    def ending(self) -> str:
        """How it ended, in words: `exit 3`, `killed by SIGKILL`."""
        if not self.killed:
            return f"exit {self.exit_code}"
        return f"killed by SIG{self.signal}" if self.signal else "killed by a signal"

    @property
    def last_word(self) -> str:
        """What it said last, for a one-line error: the last line of its stderr (the
        earlier ones lead up to it), else how it ended."""
        return (self.stderr.strip().splitlines() or [self.ending])[-1]


class FailureKind(enum.Enum):
    """Why a host gave no result. The value is what reports and --json show."""

    UNREACHABLE = "unreachable"
    AUTH_FAILED = "auth failed"
    HOST_KEY_UNKNOWN = "host key unknown"
    HOST_KEY_CHANGED = "host key changed"
    TIMED_OUT = "timed out"
    INTERRUPTED = "interrupted"
    ERROR = "error"


class RemoteError(Exception):
    """Raised by a connection when a command could not run (or finish) on its host."""

    def __init__(self, kind: FailureKind, message: str, output: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.output = output  # what a command that ran out of time had printed


@dataclass(frozen=True)
class HostFailure:
    """A host on which the work could not be done, and why, in one line; with what its
    command had printed when it ran out of time (stdout, then stderr)."""

    host: str
    kind: FailureKind
    message: str
    output: str = ""


T = TypeVar("T")


@dataclass(frozen=True)
class FanoutResult(Generic[T]):
    """Per-host values and per-host failures of one fan-out, in inventory order."""

    hosts: tuple[str, ...]
    values: Mapping[str, T] = field(default_factory=dict)
    failures: Mapping[str, HostFailure] = field(default_factory=dict)

    @property
    def failed_hosts(self) -> list[str]:
        return [h for h in self.hosts if h in self.failures]
