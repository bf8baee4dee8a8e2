"""The transaction stream and the partition committer on the in-memory Kafka: what is committed
together, what a failure at each call does to the shares in flight, what a stale membership or a
fenced producer commits (nothing), and how a new owner gets stable offsets from a dead one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError, ProducerFenced
from aiokafka.structs import OffsetAndMetadata

from service.runtime.committer import Committer
from service.runtime.faults import FaultPoints, InjectedCommitError
from service.runtime.offsets import OffsetTracker
from service.runtime.transport import GroupOffsets, Transport, TxnProducer
from service.runtime.txn_offset_commit import Membership
from service.runtime.txn_stream import CommitFailedError, GroupFencedError, TransactionStream
from service.runtime.work import Origin, Outcome, OutRecord
from service.settings import FaultSettings
from tests.support.memory_kafka import MemoryKafka, Txn, assert_every_call_failed

pytestmark = pytest.mark.timeout(10)

COMMANDS, RESULTS, SESSIONS, DLQ = "t.commands", "t.results", "t.sessions", "t.dlq"
GROUP = "g"


def make_stream(
    kafka: MemoryKafka,
    transactional_id: str = "g-a",
    *,
    membership: Callable[[], Membership | None] | None = None,
    timeout_s: float = 5.0,
    faults: FaultSettings | None = None,
    shared: bool = True,
    on_transaction: Callable[[float], None] | None = None,
) -> TransactionStream:
    return TransactionStream(
        transport=kafka,
        transactional_id=transactional_id,
        group_id=GROUP,
        sessions_topic=SESSIONS,
        membership=membership or kafka.membership,
        timeout_s=timeout_s,
        faults=FaultPoints(faults or FaultSettings()),
        shared=shared,
        on_transaction=on_transaction,
    )


@pytest.fixture
def kafka() -> MemoryKafka:
    return MemoryKafka()


@pytest.fixture
async def stream(kafka: MemoryKafka) -> AsyncIterator[TransactionStream]:
    running = make_stream(kafka)
    await running.start()
    task = asyncio.create_task(running.run())
    yield running
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await running.close()


def share(partition: int, offset: int, *, topic: str = RESULTS) -> tuple[list[OutRecord], dict]:
    records = [
        OutRecord(topic, b"s", b"p%d@%d" % (partition, offset), partition=partition),
        OutRecord(SESSIONS, b"s", b"state", partition=partition),
    ]
    return records, {TopicPartition(COMMANDS, partition): OffsetAndMetadata(offset, "")}


async def both(stream: TransactionStream, *, second_topic: str = RESULTS) -> list[object]:
    """Two partitions hand in a share at once; what each got back."""
    first = asyncio.create_task(stream.transact(0, *share(0, 1)))
    second = asyncio.create_task(stream.transact(1, *share(1, 5, topic=second_topic)))
    return list(await asyncio.gather(first, second, return_exceptions=True))


async def test_shares_handed_in_together_commit_in_one_transaction(
    kafka: MemoryKafka, stream: TransactionStream
) -> None:
    positions = await both(stream)
    assert positions == [1, 1]  # the sessions offset after each partition's state record
    assert stream.transactions == 1
    assert kafka.visible(RESULTS) == [b"p0@1", b"p1@5"]
    assert kafka.committed == {
        TopicPartition(COMMANDS, 0): (1, "g-a"),
        TopicPartition(COMMANDS, 1): (5, "g-a"),
    }
    assert [call for owner, call in kafka.calls if owner == "g-a"].count("commit") == 1


async def test_each_committed_transaction_is_reported_once_whatever_its_shares(
    kafka: MemoryKafka,
) -> None:
    reported: list[float] = []
    running = make_stream(kafka, on_transaction=reported.append)
    await running.start()
    task = asyncio.create_task(running.run())
    try:
        await both(running)
        assert len(reported) == 1  # two partitions' shares, one transaction
        kafka.fail("commit", KafkaConnectionError("broker away"))
        await both(running)
        assert len(reported) == 1  # a failed transaction is not one committed
        kafka.too_large.add(DLQ)
        await both(running, second_topic=DLQ)
        assert len(reported) == 2  # refused together, then one alone committed, one refused
        assert all(seconds >= 0 for seconds in reported)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await running.close()


async def test_a_share_without_offsets_is_refused(stream: TransactionStream) -> None:
    with pytest.raises(ValueError, match="input offsets"):
        await stream.transact(0, [], {})


@pytest.mark.parametrize("call", ["begin", "send", "delivery", "offsets", "commit"])
async def test_a_failure_at_any_call_fails_every_share_and_commits_nothing(
    kafka: MemoryKafka, stream: TransactionStream, call: str
) -> None:
    kafka.fail(call, KafkaConnectionError("broker away"))
    outcomes = await both(stream)
    assert all(isinstance(o, KafkaConnectionError) for o in outcomes), outcomes
    assert kafka.visible(RESULTS) == []
    assert kafka.committed == {}
    # The producer was renewed: the next transaction, on a new epoch, commits.
    assert all(isinstance(position, int) for position in await both(stream))
    assert kafka.visible(RESULTS) == [b"p0@1", b"p1@5"]
    assert kafka.epochs["g-a"] == 1
    assert kafka.open_entries() == 0


async def test_a_failed_partition_lookup_fails_every_share_and_commits_nothing(
    kafka: MemoryKafka, stream: TransactionStream
) -> None:
    keyed = OutRecord(RESULTS, b"s", b"keyed")  # no partition: the producer picks it
    kafka.fail("partition_of", KafkaConnectionError("no metadata"))
    first = asyncio.create_task(stream.transact(0, [keyed], share(0, 1)[1]))
    second = asyncio.create_task(stream.transact(1, *share(1, 5)))
    outcomes = await asyncio.gather(first, second, return_exceptions=True)
    assert all(isinstance(o, KafkaConnectionError) for o in outcomes), outcomes
    assert kafka.visible(RESULTS) == []
    assert kafka.committed == {}
    assert isinstance(await stream.transact(0, [keyed], share(0, 1)[1]), int)
    assert kafka.visible(RESULTS) == [b"keyed"]


async def test_a_renewal_the_broker_refuses_is_retried_by_the_next_transaction(
    kafka: MemoryKafka, stream: TransactionStream
) -> None:
    kafka.fail("commit", KafkaConnectionError("broker away"))
    kafka.fail("start", KafkaConnectionError("still away"))
    outcomes = await both(stream)
    assert all(isinstance(o, KafkaConnectionError) for o in outcomes), outcomes
    assert kafka.open_entries() > 0  # nobody could abort it yet
    assert all(isinstance(position, int) for position in await both(stream))
    assert kafka.visible(RESULTS) == [b"p0@1", b"p1@5"]
    assert kafka.open_entries() == 0


async def test_a_share_the_broker_refuses_is_retried_alone_and_fails_alone(
    kafka: MemoryKafka, stream: TransactionStream
) -> None:
    kafka.too_large.add(DLQ)
    first, second = await both(stream, second_topic=DLQ)
    assert isinstance(first, int)
    assert isinstance(second, MessageSizeTooLargeError)
    assert kafka.visible(RESULTS) == [b"p0@1"]
    assert kafka.committed == {TopicPartition(COMMANDS, 0): (1, "g-a")}
    assert kafka.open_entries() == 0


@pytest.mark.parametrize("shared", [True, False], ids=["instance-stream", "partition-stream"])
async def test_a_transaction_that_hangs_times_out_and_its_shares_fail(
    kafka: MemoryKafka, shared: bool
) -> None:
    """Only the instance's stream starts its producer again at once: a partition's own stream
    ends with its owner, which the failure fails, and a producer of the partition's
    transactional id started then would only fence a new owner (this instance may have lost the
    partition meanwhile, a pause past the session timeout). Either starts one for the next
    transaction."""
    stream = make_stream(kafka, timeout_s=0.2, shared=shared)
    await stream.start()
    epoch = kafka.epochs["g-a"]
    task = asyncio.create_task(stream.run())
    try:
        gate = kafka.hang("commit")
        with pytest.raises(CommitFailedError, match="timed out"):
            await stream.transact(0, *share(0, 1))
        gate.set()
        assert kafka.epochs["g-a"] == (epoch + 1 if shared else epoch)
        assert isinstance(await stream.transact(0, *share(0, 2)), int)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await stream.close()
    assert kafka.visible(RESULTS) == [b"p0@2"]


@pytest.mark.parametrize(
    "stale",
    [
        lambda m: Membership(m.generation_id - 1, m.member_id),
        lambda m: Membership(m.generation_id, "someone-else"),
        lambda m: None,
    ],
    ids=["older-generation", "unknown-member", "outside-any-generation"],
)
async def test_a_stale_membership_commits_nothing(
    kafka: MemoryKafka, stale: Callable[[Membership], Membership | None]
) -> None:
    current = kafka.membership()
    stream = make_stream(kafka, membership=lambda: stale(current))
    await stream.start()
    task = asyncio.create_task(stream.run())
    try:
        outcomes = await both(stream)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert all(isinstance(o, GroupFencedError) for o in outcomes), outcomes
    assert kafka.visible(RESULTS) == []
    assert kafka.committed == {}
    assert kafka.open_entries() == 0


async def test_a_zombie_after_a_rebalance_commits_nothing(
    kafka: MemoryKafka, stream: TransactionStream
) -> None:
    """The membership is read when each transaction is sent, not when the stream starts."""
    membership = kafka.membership()
    zombie = make_stream(kafka, "g-zombie", membership=lambda: membership)
    await zombie.start()
    task = asyncio.create_task(zombie.run())
    try:
        assert await zombie.transact(0, *share(0, 1)) == 1
        kafka.rebalance()
        with pytest.raises(GroupFencedError):
            await zombie.transact(0, *share(0, 2))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert kafka.visible(RESULTS) == [b"p0@1"]


async def test_a_fenced_producer_fails_its_shares_and_the_next_transaction_renews_it(
    kafka: MemoryKafka, stream: TransactionStream
) -> None:
    intruder = kafka.producer("g-a")
    await intruder.start()
    outcomes = await both(stream)
    assert all(isinstance(o, ProducerFenced) for o in outcomes), outcomes
    assert await both(stream) == [1, 1]
    assert kafka.epochs["g-a"] == 2


async def test_a_fenced_stream_leaves_the_producer_that_fenced_it_alone(
    kafka: MemoryKafka, stream: TransactionStream
) -> None:
    """A paused instance that wakes up fenced must not fence the partition's new owner in turn
    by starting a producer of the same transactional id at once."""
    intruder = kafka.producer("g-a")
    await intruder.start()
    epoch = kafka.epochs["g-a"]
    outcomes = await both(stream)
    assert all(isinstance(o, ProducerFenced) for o in outcomes), outcomes
    assert kafka.epochs["g-a"] == epoch, "the new owner's producer was fenced back"


async def test_a_stream_whose_membership_is_over_leaves_the_new_owners_producer_alone(
    kafka: MemoryKafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An instance that wakes up evicted learns it from its membership before any request: a
    producer of its transactional id started then would fence the instance that replaced it
    (the same static instance id) or the partition's new owner."""
    producer_class = type(kafka.producer("probe"))

    async def local_begin(self: Any) -> None:
        # As the service's own producer begins: locally, the epoch is seen at the first request.
        self.kafka.open[self.transactional_id] = Txn(self.transactional_id, self.epoch)

    monkeypatch.setattr(producer_class, "begin", local_begin)
    stream = make_stream(kafka, membership=lambda: None)
    await stream.start()
    task = asyncio.create_task(stream.run())
    try:
        replacement = kafka.producer("g-a")
        await replacement.start()
        epoch = kafka.epochs["g-a"]
        _, offsets = share(0, 1)  # offsets only: the membership is what refuses it
        with pytest.raises(GroupFencedError):
            await stream.transact(0, [], offsets)
        assert kafka.epochs["g-a"] == epoch, "the replacement's producer was fenced"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await stream.close()


async def test_a_share_whose_owner_gave_up_is_not_committed(
    kafka: MemoryKafka, stream: TransactionStream
) -> None:
    gate = kafka.hang("commit")
    first = asyncio.create_task(stream.transact(0, *share(0, 1)))
    while ("g-a", "commit") not in kafka.calls:  # the first transaction is in flight
        await asyncio.sleep(0)
    abandoned = asyncio.create_task(stream.transact(1, *share(1, 5)))
    await asyncio.sleep(0)  # queued behind it
    abandoned.cancel()
    with pytest.raises(asyncio.CancelledError):
        await abandoned
    gate.set()
    assert await first == 1
    await stream.transact(2, *share(2, 7))
    assert kafka.visible(RESULTS) == [b"p0@1", b"p2@7"]


async def test_claims_alone_pass_no_fault_point(kafka: MemoryKafka) -> None:
    stream = make_stream(
        kafka, faults=FaultSettings(fail_at="after_produce_before_commit", fail_after=1)
    )
    await stream.start()
    task = asyncio.create_task(stream.run())
    try:
        start = {TopicPartition(COMMANDS, 0): OffsetAndMetadata(0, "")}
        await stream.transact(0, [], start, claim=True)
        with pytest.raises(InjectedCommitError):
            await stream.transact(0, *share(0, 1))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert kafka.committed == {TopicPartition(COMMANDS, 0): (0, "g-a")}


async def test_offsets_are_unstable_while_a_dead_owner_holds_them_until_it_is_fenced(
    kafka: MemoryKafka, stream: TransactionStream
) -> None:
    inputs = [TopicPartition(COMMANDS, 0)]
    old = make_stream(kafka, "g-old")
    await old.start()
    task = asyncio.create_task(old.run())
    await old.transact(0, *share(0, 1))
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    # Its last transaction: begun, offsets committed, never ended (the process died).
    dead = kafka.producer("g-old")
    dead.epoch = kafka.epochs["g-old"]
    await dead.begin()
    await dead.send(RESULTS, 0, [OutRecord(RESULTS, b"s", b"lost", partition=0)])
    await dead.commit_offsets(GROUP, kafka.membership(), {inputs[0]: OffsetAndMetadata(2, "g-old")})

    assert await stream.stable_offsets(inputs) is None
    assert await stream.committed_metadata(inputs) == {"g-old"}
    await stream.release_offsets("g-old")
    assert await stream.stable_offsets(inputs) == {inputs[0]: (1, "g-old")}
    assert kafka.visible(RESULTS) == [b"p0@1"]
    # Its own id: an abort-only transaction of its own producer, never a new epoch.
    await stream.release_offsets(stream.transactional_id)
    assert kafka.epochs["g-a"] == 0
    assert ("g-a", "add_group") in kafka.calls


@pytest.mark.parametrize("holder", ["g-a", "g-old"])
async def test_offsets_left_pending_by_lost_markers_are_released_by_their_producer_id(
    kafka: MemoryKafka, holder: str
) -> None:
    """A broker restart completed a transaction and lost its markers: no InitProducerId ends
    its pending offsets (the successor's own, when it has the same id, or a fencing one), an
    abort of the same producer id with the group's offsets does, and the offsets stay where
    the last commit with its markers left them."""
    inputs = [TopicPartition(COMMANDS, 0)]
    kafka.committed[inputs[0]] = (1, holder)
    lost = kafka.producer(holder)
    await lost.start()
    await lost.begin()
    await lost.send(RESULTS, 0, [OutRecord(RESULTS, b"s", b"lost", partition=0)])
    await lost.commit_offsets(GROUP, kafka.membership(), {inputs[0]: OffsetAndMetadata(2, holder)})
    kafka.lose_markers(holder)
    await kafka.producer(holder).start()
    successor = make_stream(kafka, "g-a")
    await successor.start()
    task = asyncio.create_task(successor.run())
    try:
        assert await successor.stable_offsets(inputs) is None
        await successor.release_offsets(holder)
        assert await successor.stable_offsets(inputs) == {inputs[0]: (1, holder)}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await successor.close()
    assert kafka.visible(RESULTS) == []
    assert kafka.pending == {}


async def test_a_failed_release_leaves_the_offsets_pending_and_the_stream_serving(
    kafka: MemoryKafka, stream: TransactionStream
) -> None:
    inputs = [TopicPartition(COMMANDS, 0)]
    lost = kafka.producer("g-a")
    lost.epoch = kafka.epochs["g-a"]
    await lost.begin()
    await lost.commit_offsets(GROUP, kafka.membership(), {inputs[0]: OffsetAndMetadata(5, "g-a")})
    kafka.lose_markers("g-a")
    kafka.fail("add_group", KafkaConnectionError("add_group failed"))
    with pytest.raises(KafkaConnectionError):
        await stream.release_offsets("g-a")
    assert await stream.stable_offsets(inputs) is None
    await stream.release_offsets("g-a")
    assert await stream.stable_offsets(inputs) == {inputs[0]: (-1, "")}
    await stream.transact(0, *share(0, 1))
    assert kafka.visible(RESULTS) == [b"p0@1"]


async def test_an_abort_as_another_producer_ends_what_it_left_open(
    kafka: MemoryKafka, stream: TransactionStream
) -> None:
    other = kafka.producer("g-old")
    await other.start()
    await other.begin()
    await other.send(RESULTS, 0, [OutRecord(RESULTS, b"s", b"lost", partition=0)])
    tp = TopicPartition(RESULTS, 0)
    await stream.abort_as("g-old", [tp])
    await stream.abort_as("g-a", [tp])
    assert kafka.open_entries() == 0
    assert kafka.visible(RESULTS) == []


async def test_a_failed_fetch_is_an_error_not_an_answer(
    kafka: MemoryKafka, stream: TransactionStream
) -> None:
    kafka.fail("fetch", KafkaConnectionError("coordinator away"))
    with pytest.raises(KafkaConnectionError):
        await stream.stable_offsets([TopicPartition(COMMANDS, 0)])


# The committer of one partition, on the stream.


def committer(stream: TransactionStream, tracker: OffsetTracker, **options: float) -> Committer:
    return Committer(
        stream=stream,
        sessions_topic=SESSIONS,
        partition=0,
        trackers={COMMANDS: tracker},
        interval_s=0.0,
        offsets_every_s=options.get("offsets_every_s", 0.0),
    )


def outcome(
    offset: int, *, topic: str = RESULTS, fallback: bool = False, counts: list[str] | None = None
) -> Outcome:
    """An answer to the command at ``offset``; ``counts`` learns what was counted, and when."""
    counted = [] if counts is None else counts

    def replacement(_: BaseException) -> Outcome:
        return Outcome(
            records=[OutRecord(RESULTS, b"s", b"error@%d" % offset, partition=0)],
            counted=lambda: counted.append(f"error@{offset}"),
        )

    return Outcome(
        records=[OutRecord(topic, b"s", b"answer@%d" % offset, partition=0)],
        finished=[Origin(COMMANDS, 0, offset)],
        results=1,
        fallback=replacement if fallback else None,
        counted=lambda: counted.append(f"answer@{offset}"),
    )


async def test_every_commit_carries_the_offsets_even_when_they_do_not_move(
    kafka: MemoryKafka, stream: TransactionStream
) -> None:
    tracker = OffsetTracker(3)
    part = committer(stream, tracker, offsets_every_s=1e9)  # longer than any host has been up
    task = asyncio.create_task(part.run())
    try:
        await part.claim([])
        tracker.received(3)
        part.submit(outcome(3))
        await part.flush()
        assert kafka.committed[TopicPartition(COMMANDS, 0)] == (4, "g-a")  # the first moves
        tracker.received(4)
        part.submit(outcome(4))
        await part.flush()
        # Held back by offsets_every_s, yet carried: the transaction stays fenced.
        assert kafka.committed[TopicPartition(COMMANDS, 0)] == (4, "g-a")
        offsets_calls = [call for owner, call in kafka.calls if call == "offsets"]
        assert len(offsets_calls) == 3
        await part.flush(final=True)
        assert kafka.committed[TopicPartition(COMMANDS, 0)] == (5, "g-a")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert kafka.visible(RESULTS) == [b"answer@3", b"answer@4"]


async def test_a_refused_outcome_is_replaced_and_the_rest_of_its_batch_commits(
    kafka: MemoryKafka, stream: TransactionStream
) -> None:
    kafka.too_large.add(DLQ)
    tracker = OffsetTracker(0)
    part = committer(stream, tracker)
    for offset in range(4):
        tracker.received(offset)
    counts: list[str] = []
    part.submit(outcome(0, counts=counts))
    part.submit(outcome(1, topic=DLQ, fallback=True, counts=counts))
    part.submit(outcome(2, counts=counts))
    part.submit(outcome(3, topic=DLQ, counts=counts))  # nothing to write instead: dropped
    task = asyncio.create_task(part.run())
    try:
        await part.flush()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert kafka.visible(RESULTS) == [b"answer@0", b"error@1", b"answer@2"]
    assert kafka.committed[TopicPartition(COMMANDS, 0)] == (4, "g-a")
    # The metrics count what was published: the replacement, not what the broker refused.
    assert counts == ["answer@0", "error@1", "answer@2"]


async def test_a_failed_transaction_stops_the_committer(
    kafka: MemoryKafka, stream: TransactionStream
) -> None:
    tracker = OffsetTracker(0)
    part = committer(stream, tracker)
    tracker.received(0)
    part.submit(outcome(0))
    kafka.fail("commit", KafkaConnectionError("broker away"))
    with pytest.raises(KafkaConnectionError):
        await part.run()
    assert kafka.visible(RESULTS) == []
    assert kafka.committed == {}


async def test_a_failed_abort_of_a_probe_reaches_the_asker_and_the_stream_goes_on(
    kafka: MemoryKafka, stream: TransactionStream
) -> None:
    kafka.fail("abort", KafkaConnectionError("broker away"))
    with pytest.raises(KafkaConnectionError):
        await stream.abort_probe([TopicPartition(RESULTS, 0)])
    assert await stream.transact(0, *share(0, 1)) == 1
    assert kafka.visible(RESULTS) == [b"p0@1"]


async def test_a_share_of_state_records_reports_where_they_end(
    kafka: MemoryKafka, stream: TransactionStream
) -> None:
    records = [OutRecord(SESSIONS, b"k%d" % i, b"v", partition=2) for i in range(3)]
    offsets = {TopicPartition(COMMANDS, 2): OffsetAndMetadata(0, "")}
    assert await stream.transact(2, records, offsets) == 3
    assert await stream.transact(2, records[:1], offsets) == 4


async def test_a_stream_of_one_partition_commits_offsets_only_when_they_move(
    kafka: MemoryKafka,
) -> None:
    """Fenced by its transactional id, a partition's own stream needs no offsets in every
    transaction: they join when due (or on the final flush), as ``offsets_every_ms`` says."""
    stream = make_stream(kafka, "g-0", shared=False)
    await stream.start()
    task = asyncio.create_task(stream.run())
    tracker = OffsetTracker(0)
    part = committer(stream, tracker, offsets_every_s=1e9)  # longer than any host has been up
    running = asyncio.create_task(part.run())
    try:
        assert await stream.transact(0, *share(0, 0)[:1], {}) >= 0
        tracker.received(0)
        part.submit(outcome(0))
        await part.flush()  # the first commit is due: offsets move
        tracker.received(1)
        part.submit(outcome(1))
        await part.flush()  # not due: records only
        assert [call for owner, call in kafka.calls if owner == "g-0"].count("offsets") == 1
        assert kafka.committed[TopicPartition(COMMANDS, 0)] == (1, "g-0")
        await part.flush(final=True)
        assert kafka.committed[TopicPartition(COMMANDS, 0)] == (2, "g-0")
    finally:
        for running_task in (running, task):
            running_task.cancel()
        await asyncio.gather(running, task, return_exceptions=True)
    assert kafka.visible(RESULTS) == [b"p0@0", b"answer@0", b"answer@1"]


async def test_a_replacement_refused_too_gives_way_to_its_own_smaller_fallback(
    kafka: MemoryKafka, stream: TransactionStream
) -> None:
    """The refused output's replacement (a dead letter and an error result) is refused in turn
    (the dead letter's topic takes less still): the error result alone goes out, so the
    command is answered all the same."""
    kafka.too_large.add(DLQ)
    tracker = OffsetTracker(0)
    part = committer(stream, tracker)
    tracker.received(0)
    counts: list[str] = []
    error = OutRecord(RESULTS, b"s", b"error@0", partition=0)
    alone = Outcome(records=[error], counted=lambda: counts.append("error alone"))
    with_letter = Outcome(
        records=[OutRecord(DLQ, b"s", b"letter@0", partition=0), error],
        counted=lambda: counts.append("error and letter"),
        fallback=lambda _: alone,
    )
    refused = Outcome(
        records=[OutRecord(DLQ, b"s", b"answer@0", partition=0)],
        finished=[Origin(COMMANDS, 0, 0)],
        results=1,
        fallback=lambda _: with_letter,
        counted=lambda: counts.append("answer"),
    )
    part.submit(refused)
    task = asyncio.create_task(part.run())
    try:
        await part.flush()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert kafka.visible(RESULTS) == [b"error@0"]
    assert kafka.visible(DLQ) == []
    assert counts == ["error alone"]
    assert kafka.committed[TopicPartition(COMMANDS, 0)] == (1, "g-a")


def test_every_call_of_the_transport_failed_in_a_test_above(request: pytest.FixtureRequest) -> None:
    """Each call of the transport's protocols had a failure injected by a test of this module
    (a call added to them without one fails here)."""
    assert_every_call_failed(request, Transport, TxnProducer, GroupOffsets)
