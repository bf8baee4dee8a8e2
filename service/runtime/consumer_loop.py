"""The fetch loop: the only caller of :meth:`InputSource.fetch` (``getmany()``), dispatching
records to partition owners.

Guarantees: records reach their partition's owner in offset order; records of a partition with
no owner here are not taken (its next owner seeks to its committed offsets); fetching keeps being
called (so group membership stays alive) even while paused for backpressure; when the instance's
in-flight bound is reached, every assigned partition is paused, nothing dropped, and resumed once
the in-flight count drops below the bound. A failed fetch (or any failed call of the input
source) is not retried here: it ends :meth:`ConsumerLoop.run`, and with it the runtime, whose
process exits and is restarted. The loop reaches Kafka only through :class:`InputSource`, so these
rules are unit-tested on an in-memory one (``tests/unit/runtime/test_consumer_loop_rules.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from service.runtime.owner_context import InFlight
from service.runtime.partition_owner import PartitionOwner
from service.runtime.transport import InputSource

logger = logging.getLogger(__name__)

_POLL_MS = 200
_PAUSED_POLL_MS = 10


class ConsumerLoop:
    def __init__(
        self,
        consumer: InputSource,
        owners: Mapping[int, PartitionOwner],
        inflight: InFlight,
        *,
        max_records: int,
        on_turn: Callable[[], None] | None = None,
    ) -> None:
        self._consumer = consumer
        self._on_turn = on_turn if on_turn is not None else _nothing
        self._owners = owners
        self._inflight = inflight
        self._max_records = max_records
        self._stopping = asyncio.Event()
        self.paused = False

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        consumer = self._consumer
        on_turn = self._on_turn
        while not self._stopping.is_set():
            on_turn()
            batches = await consumer.fetch(
                _PAUSED_POLL_MS if self.paused else _POLL_MS, self._max_records
            )
            for tp, records in batches.items():
                owner = self._owners.get(tp.partition)
                if owner is None:
                    continue
                for record in records:
                    owner.accept(record)
            self._apply_backpressure()
            if batches:
                # getmany() returns prefetched records without suspending: without this yield a
                # whole fetch response (thousands of commands) would start before any commit's
                # I/O completes. Now one turn runs at most max_records steps.
                await asyncio.sleep(0)

    def _apply_backpressure(self) -> None:
        consumer = self._consumer
        if self._inflight.full:
            assigned = consumer.assignment()
            if assigned - consumer.paused():
                consumer.pause(*assigned)
                if not self.paused:
                    logger.info(
                        "in_flight=<%d> | in-flight bound reached, fetching paused",
                        self._inflight.count,
                    )
                self.paused = True
        elif self.paused:
            paused = consumer.paused()
            if paused:
                consumer.resume(*paused)
            self.paused = False


def _nothing() -> None:
    pass
