"""The instance's transaction stream against the real broker: shares of several partitions commit
in one transaction with their offsets under the group's current membership and the stream's
transactional id as metadata; a stale membership or a fenced producer commits nothing; a fenced
commit leaves no future behind whose exception nobody retrieves (asyncio would report it at
garbage collection); a new owner's fence aborts the open transaction of the producer the offsets
name at once. Each runs on both transaction protocols (aiokafka's producer, and the service's
own of transactions version 2)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import InvalidProducerEpoch, ProducerFenced
from aiokafka.structs import OffsetAndMetadata

from service.runtime.committer import Committer
from service.runtime.faults import FaultPoints
from service.runtime.group_member import membership_of
from service.runtime.kafka_transport import KafkaTransport
from service.runtime.offsets import OffsetTracker
from service.runtime.txn_offset_commit import Membership
from service.runtime.txn_stream import GroupFencedError, TransactionStream
from service.runtime.txn_v2 import KafkaTxnV2Producer
from service.runtime.work import Origin, Outcome, OutRecord
from service.settings import FaultSettings, KafkaSettings
from tests.conftest import CreateTopics
from tests.support.txn_probe import committed_values

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(90)]


@pytest.fixture
async def unretrieved() -> AsyncIterator[list[dict[str, Any]]]:
    """What the event loop reports through its exception handler during the test."""
    loop = asyncio.get_running_loop()
    reports: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reports.append(context))
    try:
        yield reports
    finally:
        loop.set_exception_handler(previous)


@dataclass
class Setup:
    bootstrap: str
    commands: str
    results: str
    sessions: str
    group: str
    member: AIOKafkaConsumer
    transport: KafkaTransport

    def stream(
        self, transactional_id: str, membership: Callable[[], Membership | None] | None = None
    ) -> TransactionStream:
        return TransactionStream(
            transport=self.transport,
            transactional_id=transactional_id,
            group_id=self.group,
            sessions_topic=self.sessions,
            membership=membership or (lambda: membership_of(self.member, None)),
            timeout_s=10.0,
            faults=FaultPoints(FaultSettings()),
        )

    def share(self, partition: int, offset: int) -> tuple[list[OutRecord], dict[Any, Any]]:
        records = [OutRecord(self.results, b"s", b"answer %d" % offset, partition=partition)]
        offsets = {TopicPartition(self.commands, partition): OffsetAndMetadata(offset, "")}
        return records, offsets

    async def visible(self, partition: int) -> list[bytes | None]:
        return await committed_values(self.bootstrap, TopicPartition(self.results, partition))


@pytest.fixture(params=[1, 2], ids=["txn-v1", "txn-v2"])
async def setup(
    kafka_bootstrap: str, kafka_topics: CreateTopics, unique_name: str, request: Any
) -> AsyncIterator[Setup]:
    commands, results, sessions = await kafka_topics(
        f"{unique_name}.commands",
        f"{unique_name}.results",
        f"{unique_name}.sessions",
        partitions=2,
    )
    group = f"{unique_name}-group"
    member = AIOKafkaConsumer(
        commands,
        bootstrap_servers=kafka_bootstrap,
        group_id=group,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await member.start()
    transport = KafkaTransport(
        KafkaSettings(bootstrap_servers=kafka_bootstrap),
        transaction_timeout_ms=60_000,
        make_producer=KafkaTxnV2Producer if request.param == 2 else None,
    )
    await transport.offsets.start()
    try:
        await member.getmany(timeout_ms=5000)  # joined: a generation and a member id
        assert membership_of(member, None) is not None
        yield Setup(kafka_bootstrap, commands, results, sessions, group, member, transport)
    finally:
        await transport.offsets.close()
        await member.stop()


async def _running(stream: TransactionStream) -> asyncio.Task[None]:
    await stream.start()
    return asyncio.create_task(stream.run())


async def _stable(
    stream: TransactionStream, inputs: list[TopicPartition], what: str
) -> dict[TopicPartition, tuple[int, str]]:
    """The offsets once stable: the coordinator answers EndTxn once the outcome is in its log,
    and writes the markers after; the offsets stay pending until the one on the group's
    offsets partition is in (seen once in the broker tier, with transactions version 1)."""
    deadline = asyncio.get_running_loop().time() + 10
    while (stable := await stream.stable_offsets(inputs)) is None:
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.05)
    return stable


async def _stopped(stream: TransactionStream, task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await stream.close()


async def test_shares_of_two_partitions_commit_in_one_transaction(
    setup: Setup, unique_name: str
) -> None:
    stream = setup.stream(f"{unique_name}-a")
    task = await _running(stream)
    try:
        first = asyncio.create_task(stream.transact(0, *setup.share(0, 1)))
        second = asyncio.create_task(stream.transact(1, *setup.share(1, 4)))
        await asyncio.wait_for(asyncio.gather(first, second), 20)
        assert stream.transactions == 1
        inputs = [TopicPartition(setup.commands, p) for p in (0, 1)]
        assert await _stable(stream, inputs, "still unstable after the commit") == {
            inputs[0]: (1, stream.transactional_id),
            inputs[1]: (4, stream.transactional_id),
        }
        assert await stream.committed_metadata(inputs) == {stream.transactional_id}
    finally:
        await _stopped(stream, task)
    assert await setup.visible(0) == [b"answer 1"]
    assert await setup.visible(1) == [b"answer 4"]


@pytest.mark.parametrize(
    "stale",
    [
        lambda m: Membership(m.generation_id + 1, m.member_id),
        lambda m: Membership(m.generation_id, "a-member-that-left"),
        lambda m: None,
    ],
    ids=["other-generation", "unknown-member", "outside-any-generation"],
)
async def test_a_stale_membership_commits_nothing(
    setup: Setup, unique_name: str, stale: Callable[[Membership], Membership | None]
) -> None:
    current = membership_of(setup.member, None)
    assert current is not None
    stream = setup.stream(f"{unique_name}-z", membership=lambda: stale(current))
    task = await _running(stream)
    try:
        with pytest.raises(GroupFencedError):
            await asyncio.wait_for(stream.transact(0, *setup.share(0, 1)), 20)
        assert stream.transactions == 0
        stable = await stream.stable_offsets([TopicPartition(setup.commands, 0)])
        assert stable == {TopicPartition(setup.commands, 0): (-1, "")}
    finally:
        await _stopped(stream, task)
    assert await setup.visible(0) == []


@pytest.mark.parametrize("committed_before", [False, True], ids=["first-commit", "later-commit"])
async def test_a_fenced_commit_leaves_no_unretrieved_future(
    setup: Setup,
    unique_name: str,
    unretrieved: list[dict[str, Any]],
    committed_before: bool,
) -> None:
    transactional_id = f"{unique_name}-0"
    stream = setup.stream(transactional_id)
    task = await _running(stream)
    tracker = OffsetTracker(0)
    committer = Committer(
        stream=stream,
        sessions_topic=setup.sessions,
        partition=0,
        trackers={setup.commands: tracker},
        interval_s=0.0,
        offsets_every_s=0.0,
    )
    running = asyncio.create_task(committer.run())

    def outcome(offset: int) -> Outcome:
        records, _ = setup.share(0, offset)
        return Outcome(records=records, finished=[Origin(setup.commands, 0, offset)], results=1)

    if committed_before:
        tracker.received(0)
        committer.submit(outcome(0))
        await asyncio.wait_for(committer.flush(), 10)
    successor = AIOKafkaProducer(
        bootstrap_servers=setup.bootstrap, transactional_id=transactional_id, linger_ms=0
    )
    await successor.start()
    try:
        tracker.received(1)
        committer.submit(outcome(1))
        with pytest.raises((ProducerFenced, InvalidProducerEpoch)):
            await asyncio.wait_for(running, 10)
    finally:
        await _stopped(stream, task)
        await successor.stop()
    del stream, committer, running, task
    gc.collect()
    await asyncio.sleep(0)
    messages = [report.get("message") for report in unretrieved]
    assert messages == [], unretrieved
    assert await setup.visible(0) == ([b"answer 0"] if committed_before else [])


async def test_fencing_the_producer_the_offsets_name_aborts_its_open_transaction(
    setup: Setup, unique_name: str
) -> None:
    """What a new owner does when the previous owner died mid-commit: the offsets stay unstable
    until it fences the producer they name, then they are stable at once."""
    stream = setup.stream(f"{unique_name}-old")
    task = await _running(stream)
    inputs = [TopicPartition(setup.commands, 0)]
    try:
        await asyncio.wait_for(stream.transact(0, *setup.share(0, 1)), 20)
    finally:
        await _stopped(stream, task)
    # The dead owner's last transaction: offsets and a result sent, never ended.
    dead = AIOKafkaProducer(
        bootstrap_servers=setup.bootstrap, transactional_id=f"{unique_name}-old", linger_ms=0
    )
    await dead.start()
    await dead.begin_transaction()
    await dead.send_and_wait(setup.results, b"never visible", key=b"s", partition=0)
    await dead.send_offsets_to_transaction({inputs[0]: OffsetAndMetadata(2, "")}, setup.group)
    successor = setup.stream(f"{unique_name}-new")
    follow = await _running(successor)
    try:
        assert await successor.stable_offsets(inputs) is None
        assert await successor.committed_metadata(inputs) == {f"{unique_name}-old"}
        await successor.release_offsets(f"{unique_name}-old")
        stable = await _stable(successor, inputs, "still unstable after fencing")
        assert stable == {inputs[0]: (1, f"{unique_name}-old")}
    finally:
        await _stopped(successor, follow)
        with pytest.raises(Exception):  # noqa: B017 - fenced: any failure will do
            await dead.abort_transaction()
        await dead.stop()
    assert await setup.visible(0) == [b"answer 1"]
