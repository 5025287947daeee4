"""Ctrl-C within interrupts.deferred: a call, never a KeyboardInterrupt mid-stop."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from gpucluster import interrupts


def test_presses_within_the_block_are_calls_and_the_handler_comes_back() -> None:
    pressed: list[float] = []
    before = signal.getsignal(signal.SIGINT)
    with interrupts.deferred(lambda: pressed.append(time.monotonic())):
        for _ in range(2):  # a double press
            os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 5
        while len(pressed) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # the handler runs between bytecodes of this thread
    assert len(pressed) == 2
    assert signal.getsignal(signal.SIGINT) is before
    with pytest.raises(KeyboardInterrupt):  # outside the block, Ctrl-C raises again
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)


def test_outside_the_main_thread_nothing_changes() -> None:
    seen: list[object] = []

    def work() -> None:
        with interrupts.deferred(lambda: None):
            seen.append(signal.getsignal(signal.SIGINT))

    before = signal.getsignal(signal.SIGINT)
    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    assert seen == [before]
