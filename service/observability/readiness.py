"""Readiness of one instance: ready once joined, while its group membership is current, no
rebalance is under way, and every owned partition is restored.

The runtime reports assignment and restore progress and lends a check of its membership; the
HTTP ``/readyz`` route asks. An instance that owns no partition after joining (more members than
partitions) is ready; one whose membership lapsed (the broker out of reach past the session
timeout), one between giving up its partitions and receiving its new ones, and one that left
the group serve nothing and are not.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from service.observability.metrics import Metrics


class RestoreTracker:
    """Which assigned partitions are still restoring; callable as a readiness check.

    Partitions are opaque hashables (the runtime's TopicPartition or an int). Single-threaded:
    call it from the event loop only.
    """

    def __init__(self, metrics: Metrics | None = None) -> None:
        self._metrics = metrics
        self._joined = False
        self._rebalancing = False
        self._stopping = False
        self._assigned: set[Hashable] = set()
        self._restoring: dict[Hashable, float] = {}
        self._waiting: str | None = None
        self._lost: Callable[[], str | None] | None = None

    def waiting(self, reason: str | None) -> None:
        """Why the instance cannot join yet (the broker, the topics); ``None`` once it can."""
        self._waiting = reason

    def membership(self, lost: Callable[[], str | None] | None) -> None:
        """Asked at each probe why the group membership is not current (``None`` while it is);
        set while the runtime is in its group, ``None`` outside it. Must be cheap: no I/O."""
        self._lost = lost

    def _lost_why(self) -> str | None:
        return self._lost() if self._lost is not None else None

    def assigned(self, partitions: Iterable[Hashable]) -> None:
        """Partitions were added to this instance (a rebalance ended); each restores before it
        serves."""
        self._joined = True
        self._rebalancing = False
        now = time.monotonic()
        given = list(partitions)
        for partition in given:
            self._assigned.add(partition)
            self._restoring.setdefault(partition, now)
        self._changed("assigned", given)

    def revoked(self, partitions: Iterable[Hashable], *, lost: bool = False) -> None:
        taken = list(partitions)
        for partition in taken:
            self._assigned.discard(partition)
            self._restoring.pop(partition, None)
        self._changed("lost" if lost else "revoked", taken)

    def _changed(self, kind: str, partitions: list[Hashable]) -> None:
        """Counts a change of the instance's partitions; an empty one (the revoke of nothing
        that precedes every first assignment) changes nothing and is not counted."""
        if self._metrics is not None and partitions:
            self._metrics.rebalance(kind, len(self._assigned))

    def rebalancing(self) -> None:
        """A rebalance began: the instance holds nothing until its new partitions are given."""
        self._rebalancing = True

    def left(self) -> None:
        """The instance left its group (a drain, a stop): it holds nothing from now on."""
        self.revoked(list(self._assigned))
        self._joined = False
        self._rebalancing = False

    def restoring(self, partition: Hashable) -> None:
        """An owned partition restores again (its owner was re-created): not ready until done."""
        if partition in self._assigned:
            self._restoring.setdefault(partition, time.monotonic())

    def restored(self, partition: Hashable) -> None:
        """The partition's state store is caught up; observes its restore time once."""
        started = self._restoring.pop(partition, None)
        if started is not None and self._metrics is not None:
            self._metrics.observe_restore(time.monotonic() - started)

    def stopping(self) -> None:
        """Shutdown or drain began: report not ready from now on."""
        self._stopping = True

    def __call__(self) -> bool:
        return (
            self._joined
            and not self._rebalancing
            and not self._stopping
            and not self._restoring
            and self._lost_why() is None
        )

    def describe(self) -> dict[str, Any]:
        """A JSON-able snapshot for the ``/readyz`` body."""
        snapshot: dict[str, Any] = {
            "joined": self._joined,
            "rebalancing": self._rebalancing,
            "stopping": self._stopping,
            "assigned": sorted(str(p) for p in self._assigned),
            "restoring": sorted(str(p) for p in self._restoring),
        }
        if self._waiting is not None:
            snapshot["waiting"] = self._waiting
        lost = self._lost_why()
        if lost is not None:
            snapshot["membership"] = lost
        return snapshot


class LoopHeartbeat:
    """Liveness of a polling loop: alive while :meth:`beat` was called within ``stale_after_s``.

    Alive before the first beat, so a slow start (joining, restoring) never gets the process
    restarted; only a loop that ran and then stopped turning reports dead.
    """

    def __init__(self, stale_after_s: float) -> None:
        self._stale_after_s = stale_after_s
        self._last: float | None = None

    def beat(self) -> None:
        self._last = time.monotonic()

    def rest(self) -> None:
        """The loop ended on purpose (a drain): alive from now on, as before its first beat."""
        self._last = None

    def __call__(self) -> bool:
        return self._last is None or time.monotonic() - self._last < self._stale_after_s
