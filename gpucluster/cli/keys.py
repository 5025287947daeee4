"""Single keys pressed in the terminal, for live views (`top`: q quits, c switches)."""

from __future__ import annotations

import contextlib
import os
import select
import sys
import time
from collections.abc import Callable, Iterator

KeyWait = Callable[[float], str | None]  # the key pressed, or None


@contextlib.contextmanager
def pressed_keys() -> Iterator[KeyWait]:
    """A wait(seconds) that returns the key pressed meanwhile, or None. The terminal
    passes keys at once and does not echo them (cbreak: Ctrl-C still interrupts), and
    gets its mode back however the view ends. Without a terminal on stdin it only
    waits."""
    if not sys.stdin.isatty():
        yield _sleep
        return
    import termios
    import tty

    descriptor = sys.stdin.fileno()
    saved = termios.tcgetattr(descriptor)
    tty.setcbreak(descriptor)

    def wait(seconds: float) -> str | None:
        ready, _, _ = select.select([descriptor], [], [], max(0.0, seconds))
        return os.read(descriptor, 1).decode("utf-8", "replace") if ready else None

    try:
        yield wait
    finally:
        termios.tcsetattr(descriptor, termios.TCSADRAIN, saved)


def _sleep(seconds: float) -> None:
    time.sleep(max(0.0, seconds))
