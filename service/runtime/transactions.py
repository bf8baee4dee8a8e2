"""Transactions a new owner finds left open on the partitions it writes, and their repair.

Guarantee: when :func:`resolve_open_transactions` returns, no transaction is open on the given
partitions, so the restore that follows reads every committed record and no later commit of this
owner can make visible a batch an earlier producer left behind. What the open batches held of
``results`` and ``events`` is returned; :func:`vouched` keeps the part the restored session state
says was committed, for the owner to publish again before anything else.

Why batches are left open: these partitions are written only by the producer of the instance
that owns them, and the new owner waited until the input offsets were stable (the previous
owner's transaction ended, or was aborted by fencing that producer). Yet a batch can stay
without a marker: a broker restart may drop a completed transaction's markers for partitions
that had no leader at that instant (Kafka 4.3.0 to 4.4.0, KAFKA-20734), and a produce the
coordinator never learnt of (a broker without transaction verification) gets none either.
Such a batch holds the partition's last stable offset back for ever, and the next marker of the
same producer id (markers are per producer id, whatever the epoch) would end it, so a commit of
ours would make it visible next to the work redone since: a step and its events twice.

The repair: an abort-only transaction writes to each such partition as the instance's own
producer and as the producer the partition's committed offsets name (the previous owner's; the
offsets carry the transactional id of their writer), and the ABORT marker of the one that left
the batches ends them unseen. Whether their transaction was committed cannot be asked of the
coordinator any more, so the session state decides: what the committed state records as done
(an applied command's result, events up to its event sequence number) is published again; the
rest belongs to a step that is not committed and is redone from the last committed boundary.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import orjson
from aiokafka import TopicPartition

from service.observability.metrics import Metrics
from service.runtime.work import OutRecord
from service.sessions.store import SessionStore

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
    its own can last: a new owner must repair it (:func:`resolve_open_transactions`)."""


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


async def resolve_open_transactions(
    abort: Abort,
    reader: OpenTransactionsReader,
    partitions: list[TopicPartition],
    metrics: Metrics,
    *,
    keep: frozenset[str] = frozenset(),
    settle_s: float = SETTLE_S,
) -> list[OutRecord]:
    """Wait for open transactions on ``partitions`` to end; abort those that do not.

    Returns the records the aborted batches held on the topics named in ``keep``. Raises
    :class:`HangingTransactionError` when a transaction survives our abort (a producer id other
    than ours left it; an operator must abort it, see docs/runtime.md); the owner then fails and
    is re-created later, writing nothing meanwhile.
    """
    open_now = await _open(reader, partitions, settle_s)
    if not open_now:
        return []
    left: list[OutRecord] = []
    for tp, (stable, end) in open_now.items():
        logger.warning(
            "topic=<%s>, partition=<%d>, stable_offset=<%d>, end_offset=<%d> | transaction "
            "left open found, aborting it before the partition is restored",
            tp.topic,
            tp.partition,
            stable,
            end,
        )
        if tp.topic in keep:
            left.extend(await reader.read_open(tp, stable, end))
    await abort(list(open_now))
    still_open = await _open(reader, list(open_now), settle_s)
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
    return left


def vouched(
    left: list[OutRecord], store: SessionStore, results_topic: str, events_topic: str
) -> list[OutRecord]:
    """The records of aborted batches that the restored session state records as committed:
    results of commands it lists as applied, events up to its event sequence number."""
    kept: list[OutRecord] = []
    for record in left:
        if record.key == PROBE_KEY or record.value is None:
            continue
        try:
            body = orjson.loads(record.value)
            stored = store.get(str(body["session_id"]))
        except (orjson.JSONDecodeError, KeyError, TypeError):
            continue
        if stored is None:
            continue
        if record.topic == results_topic:
            command_id = body.get("command_id")
            done = isinstance(command_id, str) and stored.delivery.answered(command_id)
        elif record.topic == events_topic:
            seq = body.get("seq")
            done = isinstance(seq, int) and seq <= stored.event_seq
        else:
            done = False
        if done:
            kept.append(record)
    if left:
        logger.warning(
            "records=<%d>, published_again=<%d> | records of transactions left open: those the "
            "committed session state records are published again, the rest is redone",
            len(left),
            len(kept),
        )
    return kept


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
