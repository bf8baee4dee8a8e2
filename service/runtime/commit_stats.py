"""Running totals of the commits of one instance, logged at a fixed interval.

Guarantee: observing a commit is O(1) and never fails; the periodic line says where commit time
goes (transactions, batch sizes, bytes, latency) until a metrics endpoint scrapes the same. A
transaction is counted once however many partitions' shares it carries: the shares report what
they wrote (:class:`CommitReport`), the transaction stream reports each transaction's time.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from service.runtime.loop_lag import LoopLag

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CommitReport:
    """What one partition's commit wrote (its share of a transaction, or its whole one)."""

    outcomes: int
    records: int
    results: int
    state_bytes: int
    states: int


class CommitStats:
    """Aggregates :class:`CommitReport` values and transaction times, and logs them every
    ``interval_s`` seconds."""

    def __init__(self, interval_s: float = 10.0, lag: LoopLag | None = None) -> None:
        self._interval_s = interval_s
        self._lag = lag
        self._reset(time.monotonic())

    def _reset(self, now: float) -> None:
        self._since = now
        self._commits = 0
        self._outcomes = 0
        self._records = 0
        self._results = 0
        self._state_bytes = 0
        self._states = 0
        self._seconds = 0.0
        self._max_seconds = 0.0

    def __call__(self, report: CommitReport) -> None:
        """A partition's commit: what it wrote."""
        self._outcomes += report.outcomes
        self._records += report.records
        self._results += report.results
        self._state_bytes += report.state_bytes
        self._states += report.states
        self._tick()

    def transaction(self, seconds: float) -> None:
        """A transaction committed, taking ``seconds`` from its begin to its commit."""
        self._commits += 1
        self._seconds += seconds
        self._max_seconds = max(self._max_seconds, seconds)
        self._tick()

    def _tick(self) -> None:
        now = time.monotonic()
        if now - self._since >= self._interval_s:
            self._log(now)
            self._reset(now)

    def _log(self, now: float) -> None:
        commits = max(self._commits, 1)
        elapsed = now - self._since
        lag_avg, lag_max = self._lag.take() if self._lag is not None else (0.0, 0.0)
        logger.info(
            "window_s=<%.1f>, commits=<%d>, results=<%d>, results_per_s=<%.1f>, "
            "outcomes_per_commit=<%.1f>, records_per_commit=<%.1f>, commit_ms_avg=<%.2f>, "
            "commit_ms_max=<%.2f>, state_bytes_avg=<%.0f>, loop_lag_ms_avg=<%.2f>, "
            "loop_lag_ms_max=<%.2f> | commit stats",
            elapsed,
            self._commits,
            self._results,
            self._results / elapsed if elapsed > 0 else 0.0,
            self._outcomes / commits,
            self._records / commits,
            self._seconds * 1000 / commits,
            self._max_seconds * 1000,
            self._state_bytes / self._states if self._states else 0.0,
            lag_avg * 1000,
            lag_max * 1000,
        )
