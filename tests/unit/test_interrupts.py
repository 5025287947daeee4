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


def test_terminations_are_presses_and_an_ignored_hangup_stays_ignored() -> None:
    """`kill`, `timeout` and a supervisor's stop send SIGTERM, a closed terminal SIGHUP:
    they used to end the CLI on the spot, leaving an attached job running unwatched."""
    saved = {n: signal.getsignal(n) for n in interrupts.PRESSES}
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
        interrupts.terminations_interrupt()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        pressed: list[int] = []
        with interrupts.deferred(lambda: pressed.append(1)):
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGHUP)  # ignored: no press
            deadline = time.monotonic() + 5
            while not pressed and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.1)
        assert pressed == [1]
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        with pytest.raises(KeyboardInterrupt):  # outside the block it raises, as Ctrl-C
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)
