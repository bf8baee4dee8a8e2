"""Open transactions a new owner finds on the partitions it writes, and their repair.

Guarantee: when :func:`resolve_open_transactions` returns, no transaction is open on any of the
given partitions, so the restore that follows reads every committed record and no later commit
of this owner can make visible a batch an earlier producer left behind.

Why it is needed: only this owner's transactional id writes these partitions, and its
InitProducerId (already done) aborted whatever transaction the coordinator knew of. A batch the
coordinator never learnt of (a produce that reached the partition leader while its
AddPartitionsToTxn did not reach the coordinator, around a broker restart) has no marker coming:
it holds the partition's last stable offset back for ever, and the next transaction marker of the
same producer id, a commit, would make it visible. Writing to the partition in a transaction of
our own and aborting it puts an ABORT marker for our producer id there, which ends every open
batch of that id on the partition (markers are per producer id, not per epoch), as
``kafka-transactions.sh abort`` would with WriteTxnMarkers.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from aiokafka import AIOKafkaProducer, TopicPartition

from service.observability.metrics import Metrics

logger = logging.getLogger(__name__)

PROBE_KEY = b"\x00cairn.txn-probe"
"""Key of the record an abort-only transaction writes (compacted topics refuse keyless ones);
it is aborted, so no read_committed reader ever sees it."""

SETTLE_S = 1.0
"""How long a gap between stable offset and end may last before it is taken for a hanging
transaction (the coordinator may still be writing the markers of one it just aborted)."""

_POLL_S = 0.05


class OffsetsReader(Protocol):
    async def stable_and_end(
        self, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, tuple[int, int]]: ...


class HangingTransactionError(RuntimeError):
    """A transaction stays open on a partition after our abort: another producer id holds it."""


async def resolve_open_transactions(
    producer: AIOKafkaProducer,
    offsets: OffsetsReader,
    partitions: list[TopicPartition],
    metrics: Metrics,
    *,
    settle_s: float = SETTLE_S,
) -> None:
    """Wait for open transactions on ``partitions`` to end; abort those that do not.

    Raises :class:`HangingTransactionError` when one survives our abort (a producer id other
    than ours left it; an operator must abort it, see docs/runtime.md); the owner then fails and
    is re-created later, writing nothing meanwhile.
    """
    open_now = await _open(offsets, partitions, settle_s)
    if not open_now:
        return
    for tp, (stable, end) in open_now.items():
        logger.warning(
            "topic=<%s>, partition=<%d>, stable_offset=<%d>, end_offset=<%d> | hanging "
            "transaction found, aborting it before the partition is restored",
            tp.topic,
            tp.partition,
            stable,
            end,
        )
    await producer.begin_transaction()
    try:
        for tp in open_now:
            await producer.send(tp.topic, key=PROBE_KEY, value=None, partition=tp.partition)
    finally:
        await producer.abort_transaction()
    still_open = await _open(offsets, list(open_now), settle_s)
    for tp in open_now:
        if tp not in still_open:
            metrics.hanging_transaction_aborted(tp.topic)
    if still_open:
        described = ", ".join(
            f"{tp.topic}-{tp.partition} (stable {stable}, end {end})"
            for tp, (stable, end) in still_open.items()
        )
        raise HangingTransactionError(
            f"a transaction of another producer stays open on {described}; "
            "abort it with kafka-transactions.sh (see docs/runtime.md)"
        )
    logger.warning(
        "partitions=<%s> | hanging transactions aborted",
        ",".join(f"{tp.topic}-{tp.partition}" for tp in open_now),
    )


async def _open(
    offsets: OffsetsReader, partitions: list[TopicPartition], settle_s: float
) -> dict[TopicPartition, tuple[int, int]]:
    """The partitions whose stable offset stays below their end for ``settle_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settle_s
    while True:
        found = await offsets.stable_and_end(partitions)
        gaps = {tp: pair for tp, pair in found.items() if pair[0] < pair[1]}
        if not gaps or loop.time() >= deadline:
            return gaps
        partitions = list(gaps)
        await asyncio.sleep(_POLL_S)
