"""Output for a process nobody watches (the `launch -d --recover` supervisor, whose
stdout and stderr are its log file): a write that fails, the disk full, is dropped
rather than raised, so that the supervisor goes on recovering the job."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, TextIO

# Set by the supervisor's spawn: its streams are a log file no one reads live.
UNWATCHED = "GPUCLUSTER_UNWATCHED_OUTPUT"


class LossyStream:
    """`stream`, except that writes and flushes that fail are dropped."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:
            return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError):
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding... as the stream's
        return getattr(self._stream, name)


def take_unwatched_streams() -> None:
    """In a process spawned with UNWATCHED set: stdout and stderr become lossy."""
    if os.environ.get(UNWATCHED):
        sys.stdout = LossyStream(sys.stdout)
        sys.stderr = LossyStream(sys.stderr)
