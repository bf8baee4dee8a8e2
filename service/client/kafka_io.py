"""The client's Kafka access: publish one command, tail or scan the output topics of a session.

Reads are ``read_committed`` (only what Cairn committed is shown) and without a consumer group,
so watching never disturbs anything. Positions are taken before a command is published, so a
follower cannot miss the answer to it.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from service.observability.tracing import TraceContext
from service.runtime.clients import admin, plain_producer, reader
from service.runtime.partitioning import keyed_partition
from service.settings import KafkaSettings

logger = logging.getLogger(__name__)

_POLL_MS = 300


class ClientError(RuntimeError):
    """Something the person can fix (no broker, no topic); printed without a traceback."""


class NoResultError(ClientError):
    """A command was sent and its result did not come within the wait's timeout: it may still
    come (exit status :data:`NO_RESULT_STATUS`, not that of what was found before sending)."""


NO_RESULT_STATUS = 3


class MissingTopicsError(ClientError):
    """Topics a command needs do not exist; the message says how to create them."""

    def __init__(self, missing: Sequence[str]) -> None:
        self.missing = list(missing)
        super().__init__(self.hint(()))

    def hint(self, connection: Sequence[str]) -> str:
        """The message, its ``cairn topics create`` given ``connection`` (the options the person
        passed, ``--bootstrap-servers H``) so it creates them on the same cluster."""
        create = shlex.join(["cairn", "topics", "create", *connection])
        return f"topics {self.missing} do not exist (run `{create}`)"


def partition_for(key: str, partitions: int) -> int:
    """The partition Kafka's default partitioner gives a key (the same as every Kafka client)."""
    return keyed_partition(key.encode(), partitions)


@dataclass(frozen=True, slots=True)
class Seen:
    """One record read from an output topic; ``body`` is None when it was not JSON."""

    topic: str
    partition: int
    offset: int
    key: str | None
    body: dict[str, Any] | None
    raw: bytes | None
    raw_key: bytes | None = None

    @property
    def session_id(self) -> str | None:
        return self.key


def _decode(value: bytes | None) -> dict[str, Any] | None:
    if value is None:
        return None
    try:
        body = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None


async def publish(
    kafka: KafkaSettings, topic: str, session_id: str, value: bytes
) -> tuple[int, int]:
    """Publish one command keyed by its session; returns (partition, offset) once acknowledged.

    A missing topic is a :class:`ClientError` before anything is sent: the producer itself would
    wait for the topic's metadata until its own timeout, whatever the command's ``--timeout``,
    and then fail with a traceback."""
    await partition_counts(kafka, [topic])
    producer = plain_producer(kafka)
    try:
        await producer.start()
    except Exception as exc:
        await producer.stop()
        raise ClientError(f"cannot reach Kafka at {kafka.bootstrap_servers}: {exc}") from exc
    try:
        headers = TraceContext.new_root().headers()
        meta = await producer.send_and_wait(
            topic, value=value, key=session_id.encode(), headers=headers
        )
        return meta.partition, meta.offset
    finally:
        await producer.stop()


async def partition_counts(kafka: KafkaSettings, topics: Sequence[str]) -> dict[str, int]:
    """Each topic's partition count as the broker reports it (the truth, whatever settings say)."""
    client = admin(kafka)
    try:
        await client.start()
        described = await client.describe_topics(list(topics))
    except Exception as exc:
        raise ClientError(f"cannot reach Kafka at {kafka.bootstrap_servers}: {exc}") from exc
    finally:
        await client.close()
    counts: dict[str, int] = {}
    for entry in described:
        name, partitions = entry.get("topic"), entry.get("partitions") or []
        if entry.get("error_code") == 0 and partitions:
            counts[str(name)] = len(partitions)
    missing = [topic for topic in topics if topic not in counts]
    if missing:
        raise MissingTopicsError(missing)
    return counts


class Reader:
    """A group-less reader over some topics, all partitions or just one session's."""

    def __init__(
        self,
        kafka: KafkaSettings,
        topics: Sequence[str],
        *,
        session_id: str | None = None,
        from_beginning: bool = False,
        key_prefix: bytes | None = None,
    ) -> None:
        """``key_prefix``: also keep records whose key starts with it (a session's history
        records on the sessions topic, beside its head)."""
        self._kafka = kafka
        self._topics = list(topics)
        self._session_id = session_id
        self._key_prefix = key_prefix
        self._from_beginning = from_beginning
        self._consumer: AIOKafkaConsumer | None = None
        self.partitions: list[TopicPartition] = []

    async def __aenter__(self) -> Reader:
        consumer = reader(self._kafka)
        try:
            await consumer.start()
        except Exception as exc:
            await consumer.stop()
            raise ClientError(
                f"cannot reach Kafka at {self._kafka.bootstrap_servers}: {exc}"
            ) from exc
        self._consumer = consumer
        try:
            await self._assign(consumer)
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def _assign(self, consumer: AIOKafkaConsumer) -> None:
        counts = await partition_counts(self._kafka, self._topics)
        for topic in self._topics:
            parts = list(range(counts[topic]))
            if self._session_id is not None:
                parts = [partition_for(self._session_id, len(parts))]
            self.partitions.extend(TopicPartition(topic, p) for p in parts)
        consumer.assign(self.partitions)
        if self._from_beginning:
            await consumer.seek_to_beginning(*self.partitions)
        else:
            ends = await consumer.end_offsets(self.partitions)
            for tp in self.partitions:
                consumer.seek(tp, ends[tp])

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()

    async def end_offsets(self) -> dict[TopicPartition, int]:
        assert self._consumer is not None
        ends: dict[TopicPartition, int] = await self._consumer.end_offsets(self.partitions)
        return ends

    async def poll(self) -> list[Seen]:
        """The records fetched in one short poll, in offset order per partition."""
        assert self._consumer is not None
        batches = await self._consumer.getmany(timeout_ms=_POLL_MS)
        seen: list[Seen] = []
        wanted = self._session_id
        also = self._key_prefix
        for tp, records in batches.items():
            for record in records:
                key = record.key.decode("utf-8", errors="replace") if record.key else None
                if (
                    wanted is not None
                    and key != wanted
                    and not (also is not None and record.key and record.key.startswith(also))
                ):
                    continue
                seen.append(
                    Seen(
                        tp.topic,
                        tp.partition,
                        record.offset,
                        key,
                        _decode(record.value),
                        record.value,
                        record.key,
                    )
                )
        return seen

    async def follow(self) -> AsyncIterator[Seen]:
        """Every new record, forever (the caller bounds it with a timeout or a break)."""
        while True:
            for item in await self.poll():
                yield item

    async def scan(self) -> list[Seen]:
        """Everything from the current positions up to the ends seen when the scan started."""
        assert self._consumer is not None
        ends = await self.end_offsets()
        out: list[Seen] = []
        while await self._behind(ends):
            out.extend(await self.poll())
        return out

    async def _behind(self, ends: dict[TopicPartition, int]) -> bool:
        assert self._consumer is not None
        for tp, end in ends.items():
            position: int = await self._consumer.position(tp)
            if position < end:
                return True
        return False
