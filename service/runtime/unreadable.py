"""Input records the consumer cannot read, found and stepped over.

Written against aiokafka 0.14.0 (the lock's version). aiokafka parses a partition's fetched
records while ``getmany()`` hands them out, and a record it cannot parse raises out of the call:
a header key that is not UTF-8 (Kafka's header keys are byte strings on the wire; other clients
write any), or a batch whose checksum fails. What the call had taken by then is lost to the
caller: the records of the partitions it drained before the failing one (their positions moved
past them) and the failing partition's records before the bad one (the partition's buffered
result ends at the next call and moves the position up to the bad record). Every later fetch
raises again at the same record, so one such record would stop every partition of the instance,
at every restart.

:func:`failed_read` finds the partition and offset of the record that failed, from the fetcher's
buffered results: aiokafka keeps each partition's fetched records not yet handed out in
``Fetcher._records``, as a ``FetchResult`` whose ``_partition_records`` iterates them with a
generator (``_records_iterator``) and keeps ``next_fetch_offset``, the offset after the last
record it read (control and aborted batches included). The one whose generator ended by raising
is the failing partition, and its ``next_fetch_offset`` is the bad record's offset: records of a
batch have consecutive offsets (the input topics are not compacted). When those internals are
not found, it finds nothing and the error is raised as before.
:class:`~service.runtime.kafka_transport.KafkaInput` does the rest (``tests/integration/
test_unreadable_records.py`` holds both to the real broker).
"""

from __future__ import annotations

import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.structs import ConsumerRecord

from service.runtime.raw_batch import RawBatch, batch_at
from service.runtime.work import InputRecord, Origin

logger = logging.getLogger(__name__)

READ_COMMITTED = 1
_BATCH_BYTES = 1024 * 1024
"""What the fetch of one batch asks for: the broker sends a whole first batch even when larger."""
UNREADABLE_AT_ONCE = 1_000
_STEP_MS = 200
_EMPTY_STEPS = 50
"""How many empty answers (of up to :data:`_STEP_MS` each) reading up to a bad record takes
before it gives up and raises: the broker is out of reach, the runtime restarts."""


def failed_read(consumer: AIOKafkaConsumer) -> tuple[TopicPartition, int] | None:
    """The partition and offset of the record whose parsing made ``consumer.getmany()`` raise,
    or ``None`` when no fetched partition failed that way."""
    buffered: Any = getattr(getattr(consumer, "_fetcher", None), "_records", None)
    if not isinstance(buffered, dict):
        return None
    for tp, result in buffered.items():
        records = getattr(result, "_partition_records", None)
        iterator = getattr(records, "_records_iterator", None)
        # A generator that ended by raising has no frame; aiokafka drops one that ended by
        # running out (and the whole result once it is handed out).
        if iterator is not None and getattr(iterator, "gi_frame", True) is None:
            offset = getattr(records, "next_fetch_offset", None)
            if isinstance(tp, TopicPartition) and isinstance(offset, int):
                return tp, offset
    return None


async def read_before(
    consumer: AIOKafkaConsumer, tp: TopicPartition, start: int, offset: int
) -> list[ConsumerRecord[Any, Any]]:
    """``tp``'s records from ``start`` up to its unreadable one at ``offset``, one at a time so
    the bad one is never handed out with them; the position is left after the last one."""
    consumer.seek(tp, start)
    taken: list[ConsumerRecord[Any, Any]] = []
    empty = 0
    while start < offset:
        try:
            got = await consumer.getmany(tp, timeout_ms=_STEP_MS, max_records=1)
        except Exception:  # the bad record again, after offsets without a record
            if failed_read(consumer) is None:
                raise
            break
        records = got.get(tp)
        if not records:
            empty += 1
            if empty >= _EMPTY_STEPS:
                raise TimeoutError(f"{tp} gave no record before offset {offset}")
            continue
        record = records[0]
        if record.offset >= offset:
            break
        taken.append(record)
        start = record.offset + 1
    return taken


async def fetch_batch(
    consumer: AIOKafkaConsumer, tp: TopicPartition, offset: int
) -> RawBatch | None:
    """The batch of ``tp`` that holds ``offset``, fetched from the partition's leader with the
    consumer's client and read by ``raw_batch.py`` (one with a fault when the answer holds no
    batch of format version 2 there); ``None`` when the broker did not answer (the leader not
    known or out of reach, an error): the caller raises, the runtime restarts."""
    client: Any = getattr(consumer, "_client", None)
    leader = client.cluster.leader_for_partition(tp) if client is not None else None
    if leader is None or leader < 0:
        return None
    request = FetchRequest(
        0, 1, _BATCH_BYTES, READ_COMMITTED, [(tp.topic, [(tp.partition, offset, _BATCH_BYTES)])]
    )
    try:
        response = await client.send(leader, request)
    except KafkaError:
        return None
    for topic, partitions in response.topics:
        for partition, error_code, _highwater, *rest in partitions:
            if topic == tp.topic and partition == tp.partition and error_code == 0:
                found = batch_at(rest[-1], offset)
                if found is None:
                    fault = "no record batch of format version 2 holds it"
                    return RawBatch(offset, offset, [], False, fault)
                return found
    return None


def batch_records(
    tp: TopicPartition, batch: RawBatch, offset: int
) -> tuple[list[InputRecord], int]:
    """The records of ``batch`` from ``offset`` on, as the runtime takes them, and the offset to
    go on from: each offset of a faulty batch comes as unreadable, at most
    :data:`UNREADABLE_AT_ONCE` of them (a checksum that fails leaves the batch's length in
    doubt), the rest at the next failed fetch."""
    if batch.fault is not None:
        last = min(batch.last_offset, offset + UNREADABLE_AT_ONCE - 1)
        logger.error(
            "topic=<%s>, partition=<%d>, offsets=<%d..%d>, fault=<%s> | input batch unreadable: "
            "its records are dead-lettered",
            tp.topic,
            tp.partition,
            offset,
            last,
            batch.fault,
        )
        reason = (
            f"record could not be read from the log ({batch.fault}); its key, value and headers "
            "stay at the source offset"
        )
        unreadable = [
            InputRecord(Origin(tp.topic, tp.partition, at), None, None, [], -1, reason)
            for at in range(offset, last + 1)
        ]
        return unreadable, last + 1
    taken = []
    for record in batch.records:
        if record.offset < offset:
            continue
        if record.replaced_keys:
            logger.warning(
                "topic=<%s>, partition=<%d>, offset=<%d>, keys=<%d> | header keys not UTF-8, "
                "read with U+FFFD in place of each invalid sequence",
                tp.topic,
                tp.partition,
                record.offset,
                record.replaced_keys,
            )
        taken.append(
            InputRecord(
                Origin(tp.topic, tp.partition, record.offset),
                record.key,
                record.value,
                record.headers,
                record.timestamp_ms,
            )
        )
    return taken, batch.last_offset + 1
