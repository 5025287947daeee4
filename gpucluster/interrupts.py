"""Ctrl-C while gpucluster is ending a job: delivered as a call, not raised.

A KeyboardInterrupt lands between any two bytecodes. A second Ctrl-C (a double press,
or `timeout -s INT`, which signals the process and then its group) used to land inside
the handling of the first and end the wait for the stop: the CLI exited and the job ran
on. Within `deferred`, each press calls `on_press` instead, and the code that stops the
job runs to its end (every remote wait in it has a timeout)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def deferred(on_press: Callable[[], None]) -> Iterator[None]:
    """Within the block, each Ctrl-C calls `on_press` instead of raising. It runs in the
    main thread between two bytecodes of whatever runs there, so it must only do what is
    safe at any point: put on a queue.SimpleQueue, set an Event. Outside the main thread
    (where no KeyboardInterrupt arrives), nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda _signal, _frame: on_press())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
