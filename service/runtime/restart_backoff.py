"""The wait before a failed partition owner is re-created.

Guarantee: each failure in a row doubles the wait, up to a cap; a partition that committed
since its last failure starts again from the shortest wait.
"""

from __future__ import annotations


class RestartBackoff:
    __slots__ = ("_cap_s", "_initial_s", "failures")

    def __init__(self, *, initial_s: float = 0.5, cap_s: float = 5.0) -> None:
        self._initial_s = initial_s
        self._cap_s = cap_s
        self.failures = 0
        """Failures in a row since the last success."""

    def failed(self) -> float:
        """Count a failure; the seconds to wait before the next attempt."""
        delay = min(self._initial_s * 2.0 ** min(self.failures, 30), self._cap_s)
        self.failures += 1
        return delay

    def succeeded(self) -> None:
        self.failures = 0
