"""Restore of one partition's session store from the compacted sessions topic.

Guarantee: reads every committed record of the partition up to the end offset observed after
the partition's producer was initialised (so no earlier owner's transaction is still open), in
log order; the store returned is complete for that partition.
"""

from __future__ import annotations

import logging
import time

from aiokafka import TopicPartition

from service.runtime.clients import reader
from service.sessions.store import SessionStore
from service.settings import KafkaSettings

logger = logging.getLogger(__name__)


async def restore_partition(kafka: KafkaSettings, topic: str, partition: int) -> SessionStore:
    store = SessionStore()
    tp = TopicPartition(topic, partition)
    started = time.monotonic()
    consumer = reader(kafka, max_partition_fetch_bytes=8 * 1024 * 1024)
    await consumer.start()
    records = 0
    try:
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        await consumer.seek_to_beginning(tp)
        while await consumer.position(tp) < end:
            batches = await consumer.getmany(tp, timeout_ms=500, max_records=10_000)
            for record in batches.get(tp, ()):
                store.load(record.key, record.value, list(record.headers))
                records += 1
    finally:
        await consumer.stop()
    logger.info(
        "topic=<%s>, partition=<%d>, records=<%d>, sessions=<%d>, seconds=<%.3f> | restored",
        topic,
        partition,
        records,
        len(store),
        time.monotonic() - started,
    )
    return store
