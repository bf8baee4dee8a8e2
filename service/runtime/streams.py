"""Where an owner's transactions go: the instance's one stream, or a stream of its own partition.

Guarantee: :meth:`Streams.open` yields a started, running stream for the partition's owner and,
for a stream of the partition's own, starts it before the owner reads anything (its
InitProducerId of ``<group_id>-<p>`` fences the partition's previous owner and aborts what it left
open) and stops it when the owner ends; the instance's stream is started and stopped by the
runtime and outlives its owners.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol

from service.runtime.txn_stream import TransactionStream


class Streams(Protocol):
    def open(self, partition: int) -> AbstractAsyncContextManager[TransactionStream]: ...


class InstanceStream:
    """Every partition's transactions go through one stream (``transaction_streams=instance``)."""

    def __init__(self, stream: TransactionStream) -> None:
        self.stream = stream

    @asynccontextmanager
    async def open(self, partition: int) -> AsyncIterator[TransactionStream]:
        del partition
        yield self.stream


class PartitionStreams:
    """Each partition's owner has a stream of its own (``transaction_streams=partition``)."""

    def __init__(self, make: Callable[[int], TransactionStream]) -> None:
        self._make = make

    @asynccontextmanager
    async def open(self, partition: int) -> AsyncIterator[TransactionStream]:
        stream = self._make(partition)
        try:
            await stream.start()
            running = asyncio.create_task(stream.run())
            try:
                yield stream
            finally:
                running.cancel()
                await asyncio.gather(running, return_exceptions=True)
        finally:
            await stream.close()
