"""Transactions a new owner finds left open on the partitions it writes, and how they end.

Guarantee: :func:`find_left_open` names every partition whose last stable offset stays below
its end and returns what the open batches hold, writing nothing; once :func:`end_left_open`
returns, no transaction is open on those partitions, so a restore that follows reads every
committed record and no later commit of this owner can make visible a batch an earlier producer
left behind. What of the open records is published again is decided between the two, while the
batches are still there to be found again by an owner that fails meanwhile
(:mod:`service.runtime.left_open`).

Why batches are left open: these partitions are written only by the producer of the instance
that owns them, and the new owner waited until the input offsets were stable (the previous
owner's transaction ended, or was aborted by fencing that producer). Yet a batch can stay
without a marker: a broker restart may drop a completed transaction's markers for partitions
that had no leader at that instant (Kafka 4.3.0 to 4.4.0, KAFKA-20734), and a produce the
coordinator never learnt of (a broker without transaction verification) gets none either.
Such a batch holds the partition's last stable offset back for ever, and the next marker of the
same producer id (markers are per producer id, whatever the epoch) would end it, so a commit of
ours would make it visible next to the work redone since: a step and its events twice.

How they end: an abort-only transaction writes to each such partition as the instance's own
producer and as the producer the partition's committed offsets name (the previous owner's; the
offsets carry the transactional id of their writer), and the ABORT marker of the one that left
the batches ends them unseen.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from aiokafka import TopicPartition

from service.observability.metrics import Metrics
from service.runtime.work import OutRecord

logger = logging.getLogger(__name__)

PROBE_KEY = b"\x00cairn.txn-probe"
"""Key of the record an abort-only transaction writes (compacted topics refuse keyless ones);
it is aborted, so no read_committed reader ever sees it."""

SETTLE_S = 1.0
"""How long a gap between stable offset and end may last before it is taken for a transaction
left open (the coordinator may still be writing the markers of one it just completed)."""

_POLL_S = 0.05


class OpenTransactionsReader(Protocol):
    async def stable_and_end(
        self, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, tuple[int, int]]: ...

    async def read_open(self, tp: TopicPartition, start: int, end: int) -> list[OutRecord]: ...


class HangingTransactionError(RuntimeError):
    """A transaction stays open on a partition after our abort: another producer id holds it."""


class StuckTransactionError(RuntimeError):
    """A transaction has stayed open on a partition this owner writes for longer than any of
    its own can last: a new owner must repair it (:func:`find_left_open`)."""


WATCH_S = 5.0
"""How often a running owner looks at the stable offsets of the partitions it writes."""


async def watch_stable_offsets(
    reader: OpenTransactionsReader,
    partitions: list[TopicPartition],
    *,
    limit_s: float,
    interval_s: float = WATCH_S,
) -> None:
    """Raise :class:`StuckTransactionError` once a partition's stable offset has stayed below
    its end, at one offset, for longer than ``limit_s``.

    An owner's own transactions end within its commit timeout, so a gap that outlives it is a
    batch whose markers were lost, most likely one of this owner's commits that the broker
    acknowledged and then forgot in a restart: its records stay invisible, and hold back every
    later one, until something ends it. A running owner does not otherwise notice (it believes
    the commit done); failing it makes the next owner repair the partition at its start. A
    failed look (the broker away) is not a finding: the next round looks again.
    """
    loop = asyncio.get_running_loop()
    stuck_since: dict[TopicPartition, tuple[int, float]] = {}
    while True:
        await asyncio.sleep(interval_s)
        try:
            offsets = await reader.stable_and_end(partitions)
        except Exception as exc:  # noqa: BLE001 - a failed look changes nothing
            logger.debug("error=<%s> | stable offsets not read, looking again later", exc)
            continue
        now = loop.time()
        for tp, (stable, end) in offsets.items():
            seen = stuck_since.get(tp)
            if stable >= end:
                stuck_since.pop(tp, None)
            elif seen is None or seen[0] != stable:
                stuck_since[tp] = (stable, now)
            elif now - seen[1] > limit_s:
                raise StuckTransactionError(
                    f"{tp.topic}-{tp.partition}: a transaction has stayed open at offset "
                    f"{stable} (end {end}) for {now - seen[1]:.0f} s, longer than any commit "
                    "of this owner: its markers were lost; a new owner repairs the partition"
                )


Abort = Callable[[list[TopicPartition]], Awaitable[None]]
"""Runs abort-only transactions writing to the given partitions, as every producer that may have
left batches open there (the instance's own, and the one the partition's offsets name)."""


@dataclass(slots=True)
class LeftOpen:
    """Transactions found left open on the partitions an owner writes."""

    gaps: dict[TopicPartition, tuple[int, int]] = field(default_factory=dict)
    """Each partition with a batch left open: its (last stable offset, end)."""
    records: list[OutRecord] = field(default_factory=list)
    """What the open batches hold on the topics asked for, in log order by partition."""


async def find_left_open(
    reader: OpenTransactionsReader,
    partitions: list[TopicPartition],
    *,
    keep: frozenset[str] = frozenset(),
    settle_s: float = SETTLE_S,
) -> LeftOpen:
    """The partitions of ``partitions`` whose stable offset stays below their end for
    ``settle_s``, and what their open batches hold on the topics named in ``keep``. Writes
    nothing: an owner that fails after it finds the same batches again."""
    gaps = await _open(reader, partitions, settle_s)
    found = LeftOpen(gaps)
    for tp, (stable, end) in gaps.items():
        logger.warning(
            "topic=<%s>, partition=<%d>, stable_offset=<%d>, end_offset=<%d> | transaction "
            "left open found",
            tp.topic,
            tp.partition,
            stable,
            end,
        )
        if tp.topic in keep:
            found.records.extend(await reader.read_open(tp, stable, end))
    return found


async def end_left_open(
    abort: Abort,
    reader: OpenTransactionsReader,
    found: LeftOpen,
    metrics: Metrics,
    *,
    settle_s: float = SETTLE_S,
) -> None:
    """Abort the batches ``found`` left open, and make sure they ended.

    Raises :class:`HangingTransactionError` when a transaction survives our abort (a producer id
    other than ours left it; an operator must abort it, see docs/runtime.md); the owner then
    fails and is re-created later, writing nothing meanwhile.
    """
    if not found.gaps:
        return
    await abort(list(found.gaps))
    still_open = await _open(reader, list(found.gaps), settle_s)
    for tp in found.gaps:
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


async def _open(
    reader: OpenTransactionsReader, partitions: list[TopicPartition], settle_s: float
) -> dict[TopicPartition, tuple[int, int]]:
    """The partitions whose stable offset stays below their end for ``settle_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settle_s
    while True:
        found = await reader.stable_and_end(partitions)
        gaps = {tp: pair for tp, pair in found.items() if pair[0] < pair[1]}
        if not gaps or loop.time() >= deadline:
            return gaps
        partitions = list(gaps)
        await asyncio.sleep(_POLL_S)
