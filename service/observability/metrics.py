"""Every Prometheus metric of the service, defined once, with the small calls the runtime makes.

Label values are normalised to fixed sets so that hostile input (an arbitrary ``type`` string in a
command) can never create unbounded series; each :class:`Metrics` owns its own registry.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from service.agent.types import STOP_REASONS

COMMAND_TYPES: Final = frozenset({"invoke", "resume", "cancel", "delete"})
COMMAND_OUTCOMES: Final = frozenset(
    {"ok", "error", "duplicate", "cancelled", "skipped", "dlq", "abandoned"}
)
CANCEL_OUTCOMES: Final = frozenset(
    {"running", "deferred", "paused", "queued", "targeted", "idle", "duplicate"}
)
"""One per applied cancel: ``targeted`` (it named a command), else the first thing it met in its
session: ``running`` or ``deferred`` (an invocation it stopped now, or after its current tools),
``paused`` (a pending checkpoint or interrupt it resolved), ``queued`` (commands published before
it that had not started, which it skipped), ``idle`` (nothing); ``duplicate``: already applied."""
REBALANCE_KINDS: Final = frozenset({"assigned", "revoked", "lost"})
OTHER: Final = "other"

METRICS_CONTENT_TYPE: Final = CONTENT_TYPE_LATEST

# Agent steps last from milliseconds (scripted model) to minutes (slow tools, long generations).
STEP_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# A commit is one short transaction; anything near a second already means trouble.
COMMIT_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
RESTORE_BUCKETS: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


def _bounded(value: str, allowed: frozenset[str]) -> str:
    return value if value in allowed else OTHER


class Metrics:
    """The service's metrics; pass one instance down from the composition root."""

    def __init__(self, registry: CollectorRegistry | None = None, *, process: bool = False) -> None:
        """``process``: the registry also holds the Python process's metrics (``process_*``,
        ``python_*``), as the served one does."""
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        if process:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            GCCollector(registry=r)
        self._commands = Counter(
            "cairn_commands",
            "Commands handled, by type and outcome.",
            ["type", "outcome"],
            registry=r,
        )
        self._results = Counter(
            "cairn_results", "Agent results published, by stop reason.", ["stop_reason"], registry=r
        )
        self._errors = Counter(
            "cairn_result_errors", "Error results published, by error code.", ["code"], registry=r
        )
        self._inflight = Gauge(
            "cairn_inflight_invocations", "Invocations running on this instance now.", registry=r
        )
        self._step = Histogram(
            "cairn_step_seconds",
            "Duration of one engine step (command in, boundary or stop out).",
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self._commit = Histogram(
            "cairn_commit_seconds",
            "Duration of one Kafka transaction committing results, state and offsets.",
            buckets=COMMIT_BUCKETS,
            registry=r,
        )
        self._restore = Histogram(
            "cairn_restore_seconds",
            "Time to restore one partition's session state before it serves commands.",
            buckets=RESTORE_BUCKETS,
            registry=r,
        )
        self._dlq = Counter(
            "cairn_dlq_records",
            "Records sent to the dead-letter topic, by reason.",
            ["reason"],
            registry=r,
        )
        self._rebalances = Counter(
            "cairn_rebalances", "Partition assignment changes, by kind.", ["kind"], registry=r
        )
        self._partitions = Gauge(
            "cairn_assigned_partitions", "Input partitions owned by this instance.", registry=r
        )
        self._cancels = Counter(
            "cairn_cancels", "Cancel commands applied, by what they found.", ["outcome"], registry=r
        )
        self._unwritable = Counter(
            "cairn_unwritable_outcomes",
            "Outputs the broker refused for good (e.g. a record too large), replaced by a small "
            "error result and a dead letter, by what was written instead.",
            ["replacement"],
            registry=r,
        )
        self._restored = Counter(
            "cairn_restored_records",
            "Sessions changelog records read by restores (a partition taken over reads only what "
            "its local store has not seen).",
            registry=r,
        )
        self._expired = Counter(
            "cairn_sessions_expired",
            "Sessions deleted after being idle longer than sessions.idle_ttl_s.",
            registry=r,
        )
        self._outcome_unknown = Counter(
            "cairn_tool_outcome_unknown",
            "Tools of effect once found started without a result (their owner stopped while they "
            "ran): the session paused on a tool_outcome_unknown interrupt instead of running "
            "them again.",
            registry=r,
        )
        self._hanging = Counter(
            "cairn_hanging_transactions_aborted",
            "Open transactions found on a partition an owner writes, left by no live producer, "
            "and aborted before the owner restored and wrote.",
            ["topic"],
            registry=r,
        )

    def command(self, command_type: str, outcome: str) -> None:
        """Count one command once its outcome is known (``ok``, ``error``, ``duplicate``, ...)."""
        self._commands.labels(
            _bounded(command_type, COMMAND_TYPES), _bounded(outcome, COMMAND_OUTCOMES)
        ).inc()

    def result(self, stop_reason: str, error_code: str | None = None) -> None:
        """Count one published result; ``error_code`` only for ``error`` results."""
        self._results.labels(_bounded(stop_reason, STOP_REASONS)).inc()
        if error_code is not None:
            self._errors.labels(error_code[:64]).inc()

    @contextmanager
    def inflight(self) -> Iterator[None]:
        """Hold the in-flight gauge up for the body's duration, whatever way it exits."""
        self._inflight.inc()
        try:
            yield
        finally:
            self._inflight.dec()

    def observe_step(self, seconds: float) -> None:
        self._step.observe(seconds)

    def observe_commit(self, seconds: float) -> None:
        self._commit.observe(seconds)

    def observe_restore(self, seconds: float) -> None:
        self._restore.observe(seconds)

    @contextmanager
    def time_commit(self) -> Iterator[None]:
        """Observe the body's duration as a commit, also when it raises (failed commits count)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self._commit.observe(time.perf_counter() - started)

    def dlq(self, reason: str) -> None:
        self._dlq.labels(reason[:64]).inc()

    def rebalance(self, kind: str, assigned_now: int) -> None:
        """Count one assignment change and record how many partitions are owned afterwards."""
        self._rebalances.labels(_bounded(kind, REBALANCE_KINDS)).inc()
        self._partitions.set(assigned_now)

    def cancel(self, outcome: str) -> None:
        """Count one applied cancel by what it met first (see :data:`CANCEL_OUTCOMES`)."""
        self._cancels.labels(_bounded(outcome, CANCEL_OUTCOMES)).inc()

    def unwritable(self, replacement: str) -> None:
        """Count one outcome the broker refused for good: ``fallback`` (its small replacement
        was written) or ``dropped`` (nothing could be written)."""
        self._unwritable.labels(replacement if replacement == "fallback" else "dropped").inc()

    def restored(self, records: int) -> None:
        self._restored.inc(records)

    def session_expired(self) -> None:
        self._expired.inc()

    def tool_outcome_unknown(self, count: int = 1) -> None:
        self._outcome_unknown.inc(count)

    def hanging_transaction_aborted(self, topic: str) -> None:
        self._hanging.labels(topic[:249]).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)
