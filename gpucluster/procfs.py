"""Whether a local process still runs, read from /proc (the supervisor's and the
sandbox's waits for a process to end)."""

from __future__ import annotations

from pathlib import Path


def gone(pid: int) -> bool:
    """No such process, or a zombie waiting to be reaped (or one being removed, X): it
    runs no more."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True
