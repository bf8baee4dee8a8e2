"""Probes of open transactions on a partition: its last stable offset against its high watermark,
and a hanging transaction fabricated on purpose, to test what repairs one.

Guarantee: ``fabricate_hanging_transaction`` returns only once a transactional batch sits on the
partition that the coordinator never heard of (no AddPartitionsToTxn was sent for it) and whose
producer is gone without EndTxn: no marker will ever end it, and InitProducerId of the same
transactional id does not abort it. It needs a broker with
``transaction.partition.verification.enable=false``; one that verifies refuses the produce.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata

from service.runtime.kafka_transport import GROUP_COORDINATOR
from service.runtime.offset_fetch import UNSTABLE_OFFSET_COMMIT, StableOffsetFetch, fetched_all
from service.runtime.txn_offset_commit import (
    NO_GENERATION,
    GroupTxnOffsetCommit,
    Membership,
    partition_errors,
)

VERIFICATION_OFF = {"transaction.partition.verification.enable": "false"}
"""Broker properties under which a fabricated transaction can reach a partition."""


class VerifiedProduceError(RuntimeError):
    """The broker refused a produce the coordinator did not know of (it verifies)."""


async def stable_and_high(
    bootstrap: str, partitions: Iterable[TopicPartition]
) -> dict[TopicPartition, tuple[int, int]]:
    """(last stable offset, high watermark) of each partition; they differ while a transaction
    is open there."""
    wanted = list(partitions)
    ends: dict[str, dict[TopicPartition, int]] = {}
    for isolation in ("read_committed", "read_uncommitted"):
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            isolation_level=isolation,
            request_timeout_ms=10_000,
        )
        await consumer.start()
        try:
            ends[isolation] = await consumer.end_offsets(wanted)
        finally:
            await consumer.stop()
    return {tp: (ends["read_committed"][tp], ends["read_uncommitted"][tp]) for tp in wanted}


async def partition_offsets(bootstrap: str, tp: TopicPartition) -> tuple[int, int]:
    """(last stable offset, high watermark) of one partition."""
    return (await stable_and_high(bootstrap, [tp]))[tp]


async def wait_until_hanging(
    bootstrap: str, tp: TopicPartition, timeout: float = 30.0
) -> tuple[int, int]:
    """Return (last stable offset, high watermark) as soon as the first is below the second."""
    deadline = time.monotonic() + timeout
    while True:
        stable, high = await partition_offsets(bootstrap, tp)
        if stable < high:
            return stable, high
        if time.monotonic() > deadline:
            raise AssertionError(f"{tp}: no open transaction in {timeout}s (LSO=HW={high})")
        await asyncio.sleep(0.05)


async def fabricate_hanging_transaction(
    bootstrap: str,
    transactional_id: str,
    tp: TopicPartition,
    *,
    key: bytes = b"hanging",
    value: bytes = b"a batch no marker will end",
    timeout: float = 30.0,
    options: Mapping[str, Any] | None = None,
) -> int:
    """Append a transactional record to ``tp`` that the coordinator never learns of; return its
    offset. The producer (InitProducerId done, so a later one of the same id gets the next
    epoch) is stopped without ending its transaction. ``options``: more aiokafka connection
    options (how to authenticate).

    Raises :class:`VerifiedProduceError` when the broker verifies transactional produces.
    """
    connection = {"bootstrap_servers": bootstrap, "request_timeout_ms": 10_000, **(options or {})}
    producer = AIOKafkaProducer(**connection, transactional_id=transactional_id)
    await producer.start()
    try:
        await producer.begin_transaction()
        # aiokafka sends AddPartitionsToTxn (and holds the produce back) only for partitions it
        # has not added to the current transaction; one it takes for added goes straight to
        # the partition leader.
        producer._txn_manager._txn_partitions.add(tp)
        try:
            async with asyncio.timeout(timeout):
                metadata = await producer.send_and_wait(
                    tp.topic, value, key=key, partition=tp.partition
                )
        except (KafkaError, TimeoutError) as error:
            raise VerifiedProduceError(
                f"{tp}: the broker refused a produce outside the coordinator's knowledge "
                f"({error!r}); start it with {VERIFICATION_OFF}"
            ) from error
    finally:
        # stop() flushes and closes; it never sends EndTxn, so the transaction stays open.
        await producer.stop()
    offset: int = metadata.offset
    return offset


async def fabricate_partial_commit(
    bootstrap: str,
    transactional_id: str,
    committed: list[tuple[TopicPartition, bytes, bytes]],
    hanging: TopicPartition,
    records: list[tuple[bytes, bytes, list[tuple[str, bytes]]]],
) -> None:
    """Commit a transaction of ``transactional_id`` holding ``committed`` (partition, key, value)
    and ``records`` (key, value, headers) on ``hanging``, a partition the coordinator never
    learns of: the commit's markers reach every partition but that one, where the batch stays
    open. What a broker restart that drops a completed transaction's markers on some of its
    partitions leaves (KAFKA-20734). Needs :data:`VERIFICATION_OFF`."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=transactional_id, request_timeout_ms=10_000
    )
    await producer.start()
    try:
        await producer.begin_transaction()
        for tp, key, value in committed:
            await producer.send_and_wait(tp.topic, value, key=key, partition=tp.partition)
        # Taken for added, so no AddPartitionsToTxn names it (see fabricate_hanging_transaction).
        producer._txn_manager._txn_partitions.add(hanging)
        for key, value, headers in records:
            await producer.send_and_wait(
                hanging.topic, value, key=key, partition=hanging.partition, headers=headers
            )
        await producer.commit_transaction()
    finally:
        await producer.stop()


async def fabricate_pending_offsets(
    bootstrap: str, transactional_id: str, group: str, tp: TopicPartition, offset: int
) -> None:
    """Leave ``offset`` of ``tp`` pending in ``group`` under the producer id of
    ``transactional_id``, in no transaction the coordinator knows of (the TxnOffsetCommit goes
    to the group coordinator with no AddOffsetsToTxn): what a broker restart that lost a
    completed transaction's markers leaves. OffsetFetch with require_stable then answers
    UNSTABLE_OFFSET_COMMIT for ``tp`` until a marker of that producer id reaches the group's
    offsets partition; no InitProducerId sends one. Needs a broker that does not verify
    transactional writes (:data:`VERIFICATION_OFF`), and a group with no member."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id)
    await producer.start()
    try:
        manager = producer._txn_manager
        node = await producer.client.coordinator_lookup(GROUP_COORDINATOR, group)
        request = GroupTxnOffsetCommit(
            transactional_id=transactional_id,
            group_id=group,
            producer_id=manager.producer_id,
            producer_epoch=manager.producer_epoch,
            membership=Membership(NO_GENERATION, ""),
            offsets={tp: OffsetAndMetadata(offset, transactional_id)},
        )
        errors = partition_errors(await producer.client.send(node, request))
        if set(errors.values()) != {0}:
            raise VerifiedProduceError(
                f"{tp}: the group coordinator refused offsets outside a transaction it knows "
                f"of ({errors}); start the broker with {VERIFICATION_OFF}"
            )
    finally:
        await producer.stop()


async def fence(bootstrap: str, transactional_id: str) -> None:
    """InitProducerId of ``transactional_id`` (the next epoch), as a new owner's producer does."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id)
    await producer.start()
    await producer.stop()


async def offsets_writers(
    bootstrap: str, group: str, partitions: list[TopicPartition]
) -> dict[TopicPartition, str]:
    """The transactional id the group's committed offset of each partition names as its writer
    (the metadata every transaction of the runtime commits its offsets with)."""
    found = await group_offsets(bootstrap, group, partitions, require_stable=False)
    writers = {tp: metadata for tp, (_, metadata, _) in found.items()}
    assert all(writers.values()), f"offsets no transaction of the runtime committed: {writers}"
    return writers


async def group_offsets(
    bootstrap: str, group: str, partitions: list[TopicPartition], *, require_stable: bool
) -> dict[TopicPartition, tuple[int, str, int]]:
    """The group's committed offsets by partition: (offset, metadata, error code); with
    ``require_stable`` a partition whose offsets are still pending has error 88."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        node = await client.coordinator_lookup(GROUP_COORDINATOR, group)
        request = StableOffsetFetch(group, partitions, require_stable=require_stable)
        return fetched_all(await client.send(node, request), request.partitions)
    finally:
        await client.close()


async def stable_group_offset(
    bootstrap: str, group: str, tp: TopicPartition, timeout: float = 10.0
) -> int:
    """The group's committed offset of ``tp`` once stable: the coordinator answers EndTxn once
    the outcome is in its log and writes the markers after, so right after a commit the offsets
    can still be pending for a moment."""
    deadline = time.monotonic() + timeout
    while True:
        [(offset, _, error)] = (
            await group_offsets(bootstrap, group, [tp], require_stable=True)
        ).values()
        if error == 0:
            return offset
        assert error == UNSTABLE_OFFSET_COMMIT, f"{tp}: offset fetch error {error}"
        assert time.monotonic() < deadline, f"{tp}: offsets still pending after {timeout}s"
        await asyncio.sleep(0.05)


async def offsets_writer(bootstrap: str, group: str, tp: TopicPartition) -> str:
    """The transactional id the group's committed offset of ``tp`` names as its writer."""
    return (await offsets_writers(bootstrap, group, [tp]))[tp]


async def committed_values(bootstrap: str, tp: TopicPartition) -> list[bytes | None]:
    """Every record value a read_committed reader gets from the partition, up to its LSO."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        values = []
        while await consumer.position(tp) < end:
            batches = await consumer.getmany(tp, timeout_ms=500)
            values.extend(record.value for record in batches.get(tp, ()))
        return values
    finally:
        await consumer.stop()
