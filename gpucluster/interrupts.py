"""Ctrl-C while gpucluster is ending a job: delivered as a call, not raised.

A KeyboardInterrupt lands between any two bytecodes. A second Ctrl-C (a double press,
or `timeout -s INT`, which signals the process and then its group) used to land inside
the handling of the first and end the wait for the stop: the CLI exited and the job ran
on. Within `deferred`, each press calls `on_press` instead, and the code that stops the
job runs to its end (every remote wait in it has a timeout).

SIGTERM and SIGHUP (a `kill`, `timeout`, a supervisor's stop, a closed terminal) are
presses too: without that they ended the CLI on the spot, and an attached job ran on,
unwatched, on every node."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# Unless ignored when gpucluster started (`nohup` ignores SIGHUP, and that stays so).
PRESSES = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def terminations_interrupt() -> None:
    """From now on SIGTERM and SIGHUP raise KeyboardInterrupt, as Ctrl-C does."""
    for number in PRESSES[1:]:
        if signal.getsignal(number) is signal.SIG_DFL:
            signal.signal(number, signal.default_int_handler)


def _handled() -> list[signal.Signals]:
    return [n for n in PRESSES if signal.getsignal(n) is not signal.SIG_IGN]


@contextmanager
def deferred(on_press: Callable[[], None]) -> Iterator[None]:
    """Within the block, each Ctrl-C calls `on_press` instead of raising. It runs in the
    main thread between two bytecodes of whatever runs there, so it must only do what is
    safe at any point: put on a queue.SimpleQueue, set an Event. Outside the main thread
    (where no KeyboardInterrupt arrives), nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {n: signal.signal(n, lambda _signal, _frame: on_press()) for n in _handled()}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
