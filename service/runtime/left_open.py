"""What a new owner publishes again of the transactions it found left open.

The open batches' records are read before anything ends them
(:func:`~service.runtime.transactions.find_left_open`), the partition is restored up to its last
stable offset, and this module decides, before the batches are aborted, what of them is
published again with the owner's first commit. Whether their transaction was committed cannot
be asked of the coordinator any more; what readers can see decides:

1. The open records on ``sessions`` are the last transaction that wrote the partition (a later
   one of the same producer would have ended them with its marker). A restart can drop a
   transaction's markers on some of its partitions only (KAFKA-20734), so that transaction
   was committed if a part of it is visible elsewhere: a committed event of one of its sessions
   past the restored state's event sequence number and up to its own, or a committed result of
   a command it lists as applied and the restored state does not. Its session records are
   then published again as they were, and the state they make is the session's state.
2. An open result or event is published again when that state (or, for the sessions step 1 did
   not publish again, the restored one) records it as done: results of commands it lists as
   applied, events up to its event sequence number. The rest belongs to a step that is not
   committed and is redone from the last committed boundary.

Nothing is written before the decision, so an owner that fails before its batches are aborted
finds them again and decides the same; once they are aborted, the decision is kept by the
instance (:class:`Held`) until a commit has published it. What is left is a process that dies in
between (docs/runtime.md, "Across broker restarts").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard

import orjson
from aiokafka import TopicPartition

from service.observability.metrics import Metrics
from service.runtime.transactions import (
    PROBE_KEY,
    Abort,
    LeftOpen,
    OpenTransactionsReader,
    end_left_open,
)
from service.runtime.work import OutRecord
from service.sessions import history
from service.sessions.codec import decode_delivery
from service.sessions.delivery import Delivery
from service.sessions.store import SessionStore, event_seq_of
from service.settings import TopicSettings

logger = logging.getLogger(__name__)

TAIL_SLACK = 5_000
"""Offsets read before the part of a transaction looked for at the end of ``results`` and
``events``: its records are the last data written there (markers and aborted batches between
them and the end take offsets too), and reading a few thousand more costs a repair little."""


class CommittedTails(Protocol):
    async def partition_for(self, topic: str, session_id: str) -> int:
        """The partition of ``topic`` that records keyed ``session_id`` go to."""
        ...

    async def partition_count(self, topic: str) -> int:
        """How many partitions ``topic`` has."""
        ...

    async def committed_tail(self, tp: TopicPartition, offsets: int) -> list[OutRecord]:
        """The committed records among the last ``offsets`` offsets before the partition's
        last stable offset, in log order."""
        ...


async def repaired_partitions(
    tails: CommittedTails, topics: TopicSettings, partition: int
) -> list[TopicPartition]:
    """The partitions the owner of ``partition`` repairs at its start and watches while it runs:
    its ``sessions`` partition, and that partition of ``results`` and ``events`` when they have
    as many partitions as ``sessions``: it then holds the records of this partition's sessions
    and only theirs. Otherwise those records are spread over partitions that other owners write
    too, and no one owner can decide for them (docs/runtime.md, "Across broker restarts")."""
    count = await tails.partition_count(topics.sessions)
    outputs = [
        topic
        for topic in (topics.results, topics.events)
        if await tails.partition_count(topic) == count
    ]
    return [TopicPartition(topic, partition) for topic in (topics.sessions, *outputs)]


@dataclass(frozen=True, slots=True)
class Done:
    """What a session's state records as done: its last event's ``seq`` and its delivery."""

    event_seq: int
    delivery: Delivery


View = Callable[[str], Done | None]


@dataclass(frozen=True, slots=True)
class Held:
    """Records an owner decided to publish again, kept by the instance from the moment the
    batches they were decided from are ended until its first commit publishes them: an owner
    failing in between (its restore or claim refused) leaves nothing on the topics to decide
    from again, so the next owner of the partition on this instance publishes these, as long
    as no record was committed on the sessions partition past ``sessions_end`` (no owner
    served it since)."""

    sessions_end: int
    records: list[OutRecord]


class Reader(CommittedTails, OpenTransactionsReader, Protocol):
    """What the repair reads: the partitions' offsets, what is open, the committed tails."""


@dataclass(frozen=True, slots=True)
class Repairing:
    """Which partition is repaired, and how."""

    topics: TopicSettings
    partition: int
    metrics: Metrics
    settle_s: float


async def restore_repaired(
    reader: Reader,
    restore: Callable[[], Awaitable[SessionStore]],
    abort: Abort,
    found: LeftOpen,
    held: dict[int, Held],
    repairing: Repairing,
) -> tuple[SessionStore, list[OutRecord]]:
    """The partition's store, restored with every batch ``found`` left open ended, and the
    records to publish again with the owner's first commit (which must then drop
    ``held[partition]``).

    With batches found, the decision is taken between a restore up to the last stable offset
    and their end, and held from their end on. Without, what an earlier owner of this instance
    held is published, if no record was committed on the sessions partition since it was held.
    """
    partition, topics = repairing.partition, repairing.topics
    sessions = TopicPartition(topics.sessions, partition)
    store = await restore()
    kept = held.get(partition)
    if found.gaps:
        # Batches left open now (a claim of ours that failed and was not aborted, say) are
        # decided afresh: they hold what was kept, or supersede it.
        held.pop(partition, None)
        again = await published_again(found.records, store, reader, topics, partition)
        await end_left_open(abort, reader, found, repairing.metrics, settle_s=repairing.settle_s)
        if again:
            end = (await reader.stable_and_end([sessions]))[sessions][1]
            held[partition] = Held(end, again)
        return await restore(), again
    if kept is None:
        return store, []
    # A failed read leaves them held: the next owner looks again.
    stable, end = (await reader.stable_and_end([sessions]))[sessions]
    if stable == end >= kept.sessions_end and not await reader.committed_tail(
        sessions, end - kept.sessions_end
    ):
        return store, kept.records
    logger.warning(
        "partition=<%d>, records=<%d> | records held to publish again are dropped: the "
        "sessions partition was written since",
        partition,
        len(kept.records),
    )
    del held[partition]
    return store, []


def published(again: list[OutRecord], store: SessionStore, sessions_topic: str) -> None:
    """Once the records :func:`restore_repaired` returned are committed: the session records
    among them into ``store``, written now (as a commit's own are)."""
    now_ms = int(time.time() * 1000)
    for record in again:
        if record.topic == sessions_topic:
            store.load(record.key, record.value, record.headers, now_ms)


async def published_again(
    left: list[OutRecord],
    store: SessionStore,
    tails: CommittedTails,
    topics: TopicSettings,
    partition: int,
) -> list[OutRecord]:
    """The records of ``left`` (read from ``partition`` of the topics an owner writes) to
    publish again, in the order to publish them; ``store`` is the partition restored up to its
    last stable offset."""
    sessions = [r for r in left if r.topic == topics.sessions and r.key and r.key != PROBE_KEY]
    others = [r for r in left if r.topic != topics.sessions]
    written = _written(sessions, store)

    def restored(session_id: str) -> Done | None:
        done = store.done(session_id)
        return None if done is None else Done(*done)

    if written and await _visible_elsewhere(written, restored, tails, topics):
        logger.warning(
            "partition=<%d>, records=<%d> | the open transaction on the sessions topic was "
            "committed (a part of it is visible on the results or events topic): its session "
            "records are published again",
            partition,
            len(sessions),
        )
        kept = vouched(others, lambda s: written.get(s) or restored(s), topics)
        return sessions + kept
    return vouched(others, restored, topics)


def vouched(left: list[OutRecord], done: View, topics: TopicSettings) -> list[OutRecord]:
    """The results and events of ``left`` that ``done`` records: results of commands it lists
    as applied, events up to its event sequence number."""
    kept: list[OutRecord] = []
    for record in left:
        found = _body(record)
        if found is None:
            continue
        session_id, body = found
        known = done(session_id)
        if known is None:
            continue
        if record.topic == topics.results:
            command_id = body.get("command_id")
            ok = isinstance(command_id, str) and known.delivery.answered(command_id)
        elif record.topic == topics.events:
            seq = body.get("seq")
            ok = _is_seq(seq) and seq <= known.event_seq
        else:
            ok = False
        if ok:
            kept.append(record)
    if left:
        logger.warning(
            "records=<%d>, published_again=<%d> | results and events of transactions left open: "
            "those the session state records are published again, the rest is redone",
            len(left),
            len(kept),
        )
    return kept


def _written(records: list[OutRecord], store: SessionStore) -> dict[str, Done]:
    """What each session of the open sessions records leaves done (its last head there over its
    restored applied command ids), read without decoding its conversation; a session they
    delete, or whose head or applied ids they leave unreadable, is left out."""
    by_session: dict[str, list[OutRecord]] = {}
    for record in records:
        assert record.key is not None
        head = history.head_key_of(record.key).decode("utf-8", "replace")
        by_session.setdefault(head, []).append(record)
    written: dict[str, Done] = {}
    for session_id, mine in by_session.items():
        heads = [r for r in mine if r.key == session_id.encode()]
        if not heads or heads[-1].value is None:
            continue
        applied = history.prefix(session_id) + history.APPLIED
        merged = dict(store.table.scan(applied))
        for record in mine:
            if record.key is None or not record.key.startswith(applied):
                continue
            if record.value is None:
                merged.pop(record.key, None)
            else:
                merged[record.key] = record.value
        try:
            delivery = decode_delivery(heads[-1].value, merged)
        except ValueError:
            continue
        written[session_id] = Done(event_seq_of(heads[-1].headers), delivery)
    return written


async def _visible_elsewhere(
    written: dict[str, Done],
    restored: View,
    tails: CommittedTails,
    topics: TopicSettings,
) -> bool:
    """Whether a committed event or result shows that the transaction that wrote ``written``
    was committed: one it made that the restored state does not record."""
    events: dict[str, range] = {}
    commands: dict[str, set[str]] = {}
    for session_id, after in written.items():
        before = restored(session_id) or Done(0, Delivery())
        if after.event_seq > before.event_seq:
            events[session_id] = range(before.event_seq + 1, after.event_seq + 1)
        new = set(after.delivery.applied) - set(before.delivery.applied)
        if new:
            commands[session_id] = new
    if events and await _seen(
        tails,
        topics.events,
        events,
        lambda body, mine: _is_seq(body.get("seq")) and body["seq"] in mine,
    ):
        return True
    return bool(commands) and await _seen(
        tails,
        topics.results,
        commands,
        lambda body, mine: isinstance(body.get("command_id"), str) and body["command_id"] in mine,
    )


async def _seen(
    tails: CommittedTails,
    topic: str,
    wanted: Mapping[str, Collection[object]],
    match: Callable[[dict[str, Any], Collection[object]], bool],
) -> bool:
    """Whether a committed record of ``topic`` matches what ``wanted`` lists for its session
    (read at the end of each partition the sessions' records go to)."""
    by_partition: dict[int, dict[str, Collection[object]]] = {}
    for session_id, mine in wanted.items():
        partition = await tails.partition_for(topic, session_id)
        by_partition.setdefault(partition, {})[session_id] = mine
    for partition, here in by_partition.items():
        span = sum(len(mine) for mine in here.values()) + TAIL_SLACK
        for record in await tails.committed_tail(TopicPartition(topic, partition), span):
            found = _body(record)
            if found is not None and found[0] in here and match(found[1], here[found[0]]):
                return True
    return False


def _body(record: OutRecord) -> tuple[str, dict[str, Any]] | None:
    """The session id and JSON object of a result or event."""
    if record.key == PROBE_KEY or record.value is None:
        return None
    try:
        body = orjson.loads(record.value)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict):
        return None
    session_id = body.get("session_id")
    return (session_id, body) if isinstance(session_id, str) else None


def _is_seq(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
