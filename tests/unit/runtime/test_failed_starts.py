"""A client whose start fails is stopped: aiokafka reports a consumer or producer collected
unstopped as an ERROR (``Unclosed AIOKafkaConsumer``), one per retried start while the broker is
away. Against a port nothing listens on, so the start fails at once without a broker."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaConnectionError

from service.runtime import clients, restore, standby
from service.runtime.kafka_transport import KafkaGroupOffsets
from service.runtime.restore import SessionsReader
from service.runtime.standby import Standby
from service.runtime.topics import partition_counts
from service.settings import KafkaSettings


@pytest.fixture
def kafka() -> KafkaSettings:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return KafkaSettings(bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=2_000)


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[AIOKafkaConsumer]]:
    """Every reader the restore and the standby make."""
    consumers: list[AIOKafkaConsumer] = []

    def recorded(kafka: KafkaSettings, **extra: Any) -> AIOKafkaConsumer:
        consumers.append(clients.reader(kafka, **extra))
        return consumers[-1]

    monkeypatch.setattr(restore, "reader", recorded)
    monkeypatch.setattr(standby, "reader", recorded)
    yield consumers


async def test_the_sessions_readers_are_stopped_when_their_start_fails(
    kafka: KafkaSettings, made: list[AIOKafkaConsumer], monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions = SessionsReader(kafka, "sessions")
    tp = TopicPartition("sessions", 0)
    with pytest.raises(KafkaConnectionError):
        await sessions.stable_and_end([tp])

    async def one_partition(topic: str) -> int:
        return 1

    # Known already (asked of the broker once), so the fork's read starts its reader.
    monkeypatch.setattr(sessions, "partition_count", one_partition)
    with pytest.raises(KafkaConnectionError):
        await sessions.session_records("s-1")
    assert len(made) == 2
    assert all(consumer._closed for consumer in made)
    await sessions.close()


async def test_the_standby_reader_is_stopped_when_its_start_fails(
    kafka: KafkaSettings,
    made: list[AIOKafkaConsumer],
    tmp_path: Path,
) -> None:
    with pytest.raises(KafkaConnectionError):
        await Standby(kafka, "sessions", tmp_path, max_age_s=60).run()
    assert [consumer._closed for consumer in made] == [True]


async def test_started_stops_the_client_it_could_not_start(kafka: KafkaSettings) -> None:
    consumer = clients.reader(kafka)
    with pytest.raises(KafkaConnectionError):
        await clients.started(consumer)
    assert consumer._closed


async def test_admin_and_offset_clients_close_when_they_cannot_reach_the_broker(
    kafka: KafkaSettings,
) -> None:
    with pytest.raises(KafkaConnectionError):
        await partition_counts(kafka, ["commands"])
    offsets = KafkaGroupOffsets(kafka)
    with pytest.raises(KafkaConnectionError):
        await offsets.start()
    assert offsets._client is None
