"""How the producer of transactions version 2 sends, on a scripted client: what one loop turn
sends travels in one request per leader; a batch answered with an error it can outlive is sent
again byte for byte (same sequence number, so the broker writes it once); an error it cannot
outlive fails that batch alone, with the class the stream tells unwritable records by; a
transaction with a failed batch never commits, and one that wrote nothing ends without EndTxn."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError, ProducerFenced

from service.runtime.transport import CommitFailedError
from service.runtime.txn_v2 import KafkaTxnV2Producer, UnsupportedBrokerError
from service.runtime.txn_v2_requests import EndTxn, TxnProduce
from service.runtime.work import OutRecord
from service.settings import KafkaSettings

A0 = TopicPartition("a", 0)
B0 = TopicPartition("b", 0)


@dataclass
class Answer:
    responses: list[tuple[str, list[tuple[Any, ...]], dict[int, bytes]]]


@dataclass
class Ended:
    error_code: int = 0
    producer_id: int = 1
    producer_epoch: int = 9


class Cluster:
    def __init__(self, leaders: dict[TopicPartition, int]) -> None:
        self.leaders = leaders

    def leader_for_partition(self, tp: TopicPartition) -> int | None:
        return self.leaders.get(tp)


@dataclass
class ScriptedClient:
    """Answers each partition's produce from its script (error codes, 0 meaning written at the
    next offset); raises ``KafkaConnectionError`` for a ``None`` entry."""

    cluster: Cluster
    script: dict[TopicPartition, list[int | None]] = field(default_factory=dict)
    sent: list[tuple[int, dict[TopicPartition, bytes]]] = field(default_factory=list)
    ended: list[bool] = field(default_factory=list)
    offsets: dict[TopicPartition, int] = field(default_factory=dict)

    async def send(self, node: int, request: Any) -> Any:
        await asyncio.sleep(0)
        if isinstance(request, EndTxn):
            self.ended.append(request.committed)
            return Ended()
        assert isinstance(request, TxnProduce)
        batches = {tp: bytes(records) for tp, records in request.batches.items()}
        self.sent.append((node, batches))
        codes = {tp: (self.script.get(tp) or [0]).pop(0) for tp in batches}
        if any(code is None for code in codes.values()):
            raise KafkaConnectionError("gone")
        answers: dict[str, list[tuple[Any, ...]]] = {}
        for tp, code in codes.items():
            base = self.offsets.get(tp, 0)
            if code == 0:
                self.offsets[tp] = base + 1
            answers.setdefault(tp.topic, []).append((tp.partition, code, base, -1, 0, [], None, {}))
        return Answer([(topic, parts, {}) for topic, parts in answers.items()])

    async def coordinator_lookup(self, kind: int, key: str) -> int:
        return 100

    async def bootstrap(self) -> None:
        return None

    def force_metadata_update(self) -> asyncio.Future[bool]:
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        done.set_result(True)
        return done

    async def close(self) -> None:
        return None


def _producer(client: ScriptedClient) -> KafkaTxnV2Producer:
    producer = KafkaTxnV2Producer(KafkaSettings(bootstrap_servers="nowhere:1"), "tx", 1_000)
    producer._client = client  # type: ignore[assignment]
    producer._producer_id, producer._epoch = 1, 8
    return producer


def _record(topic: str, value: bytes = b"v") -> list[OutRecord]:
    return [OutRecord(topic, b"k", value)]


async def _send(producer: KafkaTxnV2Producer, tp: TopicPartition) -> asyncio.Future[int]:
    (delivery,) = await producer.send(tp.topic, tp.partition, _record(tp.topic))
    return delivery[0]


@pytest.fixture
def client() -> ScriptedClient:
    return ScriptedClient(Cluster({A0: 1, B0: 2, TopicPartition("a", 1): 1}))


async def test_one_loop_turn_travels_in_one_request_per_leader(client: ScriptedClient) -> None:
    producer = _producer(client)
    a0, a1, b0 = [await _send(producer, tp) for tp in (A0, TopicPartition("a", 1), B0)]
    await asyncio.gather(a0, a1, b0)
    assert sorted((node, sorted(batches)) for node, batches in client.sent) == [
        (1, [A0, TopicPartition("a", 1)]),
        (2, [B0]),
    ]
    await producer.commit()
    assert client.ended == [True]


@pytest.mark.parametrize(
    ("answers", "name"),
    [
        ([19, 0], "NOT_ENOUGH_REPLICAS"),
        ([51, 51, 0], "CONCURRENT_TRANSACTIONS"),
        ([6, 0], "NOT_LEADER_OR_FOLLOWER"),
        ([None, 0], "connection lost"),
    ],
)
async def test_a_batch_is_sent_again_byte_for_byte_until_written(
    client: ScriptedClient, answers: list[int | None], name: str
) -> None:
    client.script[A0] = list(answers)
    producer = _producer(client)
    delivery = await _send(producer, A0)
    assert await delivery == 0, name
    sent = [batches[A0] for _, batches in client.sent]
    assert len(sent) == len(answers)
    assert len(set(sent)) == 1, "resent with the same sequence number and bytes"


async def test_a_refused_batch_fails_alone_with_its_aiokafka_class(
    client: ScriptedClient,
) -> None:
    client.script[A0] = [10]  # MESSAGE_TOO_LARGE
    client.cluster.leaders[B0] = 1
    producer = _producer(client)
    refused, written = await _send(producer, A0), await _send(producer, B0)
    assert await written == 0
    with pytest.raises(MessageSizeTooLargeError):
        await refused
    with pytest.raises(CommitFailedError):
        await producer.commit()
    assert client.ended == []
    await producer.abort()
    assert client.ended == [False]


async def test_a_fenced_answer_fails_the_batch_as_fenced(client: ScriptedClient) -> None:
    client.script[A0] = [90]  # PRODUCER_FENCED
    producer = _producer(client)
    delivery = await _send(producer, A0)
    with pytest.raises(ProducerFenced):
        await delivery


async def test_a_partitions_later_batch_waits_for_the_earlier(client: ScriptedClient) -> None:
    client.script[A0] = [19, 0, 0]
    producer = _producer(client)
    records = [OutRecord("a", b"k", bytes([n]) * 200_000) for n in range(2)]
    deliveries = await producer.send("a", 0, records)
    assert [await offset for offset, _ in deliveries] == [0, 1]
    assert [list(batches) for _, batches in client.sent] == [[A0], [A0], [A0]]
    first, again, second = (batches[A0] for _, batches in client.sent)
    assert first == again != second


async def test_a_transaction_that_wrote_nothing_ends_without_end_txn(
    client: ScriptedClient,
) -> None:
    producer = _producer(client)
    await producer.begin()
    await producer.commit()
    await producer.begin()
    await producer.abort()
    assert client.ended == []


async def test_commit_takes_the_next_epoch_and_restarts_sequences(client: ScriptedClient) -> None:
    producer = _producer(client)
    await (await _send(producer, A0))
    assert producer._sequences == {A0: 1}
    await producer.commit()
    assert (producer._producer_id, producer._epoch, producer._sequences) == (1, 9, {})


async def test_a_broker_without_the_requests_gets_a_clear_error(client: ScriptedClient) -> None:
    async def refuse(node: int, request: Any) -> Any:
        return request.prepare({0: (3, 11), 22: (0, 4), 26: (0, 3)})

    client.send = refuse  # type: ignore[method-assign]
    producer = _producer(client)
    with pytest.raises(UnsupportedBrokerError, match="transactions_version=1"):
        await producer.start()
    delivery = await _send(producer, A0)
    with pytest.raises(CommitFailedError, match="transactions_version=1"):
        await delivery
