"""The consumer-group rebalance listener: hands partition changes to the runtime.

aiokafka calls ``on_partitions_revoked`` on every member before any member's
``on_partitions_assigned``, and waits for both; so an old owner's drain (its last commit)
completes before the group hands the partition to its next owner.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from aiokafka import ConsumerRebalanceListener, TopicPartition

PartitionsHandler = Callable[[set[int]], Awaitable[None]]


class RebalanceListener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, *, on_revoked: PartitionsHandler, on_assigned: PartitionsHandler) -> None:
        self._on_revoked = on_revoked
        self._on_assigned = on_assigned

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        await self._on_revoked({tp.partition for tp in revoked})

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        await self._on_assigned({tp.partition for tp in assigned})
