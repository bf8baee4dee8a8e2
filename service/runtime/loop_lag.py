"""A probe of event-loop lag: how late a short sleep wakes up, sampled continuously.

Guarantee: costs one wake-up per interval; what it reports is the delay every I/O completion
(a commit's next round trip, a model's next chunk) suffered on this loop in the window.
"""

from __future__ import annotations

import asyncio
import time


class LoopLag:
    def __init__(self, interval_s: float = 0.02) -> None:
        self._interval_s = interval_s
        self._total = 0.0
        self._worst = 0.0
        self._samples = 0

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            await asyncio.sleep(self._interval_s)
            late = max(0.0, time.monotonic() - started - self._interval_s)
            self._total += late
            self._worst = max(self._worst, late)
            self._samples += 1

    def take(self) -> tuple[float, float]:
        """(average, worst) lag in seconds since the last call."""
        average = self._total / self._samples if self._samples else 0.0
        worst = self._worst
        self._total, self._worst, self._samples = 0.0, 0.0, 0
        return average, worst
