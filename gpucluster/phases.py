"""Wall time per phase of a command, from the phase names it announces as it goes (a
phase ends where the next one begins): where a long provision spent its time."""

from __future__ import annotations

import time
from collections.abc import Callable


class PhaseTimes:
    """An `on_step(name)` callback that times each phase, passing the call on."""

    def __init__(self, then: Callable[[str], None] | None = None) -> None:
        self._then = then
        self._starts: list[tuple[str, float]] = []

    def __call__(self, phase: str) -> None:
        self._starts.append((phase, time.monotonic()))
        if self._then is not None:
            self._then(phase)

    def durations(self) -> dict[str, float]:
        """Each phase's seconds, in order; the last one's until now."""
        if not self._starts:
            return {}
        ends = [start for _, start in self._starts[1:]] + [time.monotonic()]
        return {phase: end - start
                for (phase, start), end in zip(self._starts, ends, strict=True)}
