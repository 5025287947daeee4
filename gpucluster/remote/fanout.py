"""Do the same work on many hosts at once, with a bound, and never stop early.

Worker threads are daemons so that Ctrl-C ends the run at once: the main thread only
waits, and on KeyboardInterrupt it stops handing out hosts, lets the caller close the
connections (which unblocks the workers), and re-raises.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import TypeVar

from gpucluster import interrupts
from gpucluster.errors import GpuclusterError, Interrupted
from gpucluster.inventory import Host
from gpucluster.remote.result import FailureKind, FanoutResult, HostFailure, RemoteError

T = TypeVar("T")
DEFAULT_FANOUT = 64


def fan_out(
    hosts: Sequence[Host],
    task: Callable[[Host], T],
    parallelism: int = DEFAULT_FANOUT,
    on_done: Callable[[str, T | HostFailure], None] | None = None,
    on_interrupt: Callable[[], None] | None = None,
) -> FanoutResult[T]:
    """Run `task(host)` for every host, at most `parallelism` at a time."""
    pending = deque(hosts)
    values: dict[str, T] = {}
    failures: dict[str, HostFailure] = {}
    lock = threading.Lock()
    all_done = threading.Event()
    stopping = threading.Event()
    left = [len(hosts)]

    def worker() -> None:
        while not stopping.is_set():
            with lock:
                if not pending:
                    return
                host = pending.popleft()
            outcome: T | HostFailure
            try:
                outcome = task(host)
            except RemoteError as error:
                outcome = HostFailure(host.name, error.kind, error.message, error.output)
            except GpuclusterError as error:  # a message of ours, said as it is
                outcome = HostFailure(host.name, FailureKind.ERROR, str(error))
            except Exception as error:
                outcome = HostFailure(host.name, FailureKind.ERROR,
                                      f"{type(error).__name__}: {error}")
            with lock:
                if isinstance(outcome, HostFailure):
                    failures[host.name] = outcome
                else:
                    values[host.name] = outcome
                left[0] -= 1
                if left[0] == 0:
                    all_done.set()
            if on_done is not None and not stopping.is_set():
                on_done(host.name, outcome)

    if not hosts:
        all_done.set()
    for _ in range(min(parallelism, len(hosts))):
        threading.Thread(target=worker, daemon=True).start()
    try:
        while not all_done.wait(0.2):
            pass
    except KeyboardInterrupt:
        stopping.set()
        with lock:  # counted before the clean-up: closing a connection ends its task
            unfinished = [h.name for h in hosts
                          if h.name not in values and h.name not in failures]
        if on_interrupt is not None:
            with interrupts.deferred(lambda: None):  # a second Ctrl-C must not cut it
                on_interrupt()
        raise Interrupted(f"interrupted; {len(unfinished)} of {len(hosts)} hosts had not "
                          f"finished; connections closed") from None
    return FanoutResult(tuple(h.name for h in hosts), values, failures)
