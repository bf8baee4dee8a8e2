"""The consumer loop on the in-memory input: records reach their partition's owner in offset
order, records of partitions owned elsewhere are not taken, the in-flight bound pauses every
assigned partition while fetching goes on and resumes it once the count drops, and a failure at
any call of the input ends the loop (the runtime, and its process, end with it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, cast

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError

from service.runtime.consumer_loop import ConsumerLoop
from service.runtime.owner_context import InFlight
from service.runtime.partition_owner import PartitionOwner
from service.runtime.transport import InputSource
from service.runtime.work import InputRecord, OutRecord
from tests.support.memory_kafka import MemoryInput, MemoryKafka, assert_every_call_failed

pytestmark = pytest.mark.timeout(10)

COMMANDS, CONTROL = "t.commands", "t.control"


class Taker:
    """Stands in for a partition owner: keeps what it is given, counted in flight as the owner
    counts it."""

    def __init__(self, inflight: InFlight) -> None:
        self.inflight = inflight
        self.taken: list[InputRecord] = []

    def accept(self, record: InputRecord) -> None:
        self.taken.append(record)
        self.inflight.count += 1

    def offsets(self, topic: str = COMMANDS) -> list[int]:
        return [r.origin.offset for r in self.taken if r.origin.topic == topic]


class Bench:
    def __init__(self, partitions: Iterable[int] = (0, 1), *, limit: int = 1_000) -> None:
        self.kafka = MemoryKafka()
        self.input = MemoryInput(self.kafka)
        self.input.assign(
            TopicPartition(topic, p) for p in partitions for topic in (COMMANDS, CONTROL)
        )
        self.inflight = InFlight(limit)
        self.owners: dict[int, Taker] = {}

    def own(self, partition: int) -> Taker:
        taker = self.owners[partition] = Taker(self.inflight)
        return taker

    def put(self, partition: int, count: int, topic: str = COMMANDS) -> None:
        for _ in range(count):
            log = self.kafka.logs[(topic, partition)]
            self.kafka.append(topic, partition, b"s", b"v%d" % len(log))

    def loop(self, max_records: int = 3) -> ConsumerLoop:
        owners = cast(dict[int, PartitionOwner], self.owners)
        return ConsumerLoop(self.input, owners, self.inflight, max_records=max_records)


async def until(condition: Callable[[], bool], what: str) -> None:
    try:
        async with asyncio.timeout(5):
            while not condition():
                await asyncio.sleep(0.001)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


@pytest.fixture
async def running() -> AsyncIterator[Callable[[ConsumerLoop], asyncio.Task[None]]]:
    tasks: list[tuple[ConsumerLoop, asyncio.Task[None]]] = []

    def start(loop: ConsumerLoop) -> asyncio.Task[None]:
        task = asyncio.create_task(loop.run())
        tasks.append((loop, task))
        return task

    yield start
    for loop, task in tasks:
        loop.stop()
        await asyncio.gather(task, return_exceptions=True)


async def test_records_reach_their_owner_in_offset_order(running: Any) -> None:
    bench = Bench()
    first, second = bench.own(0), bench.own(1)
    bench.put(0, 7)
    bench.put(1, 5)
    bench.put(1, 2, CONTROL)
    running(bench.loop(max_records=3))
    await until(lambda: len(first.taken) == 7 and len(second.taken) == 7, "every record")
    assert first.offsets() == list(range(7))
    assert second.offsets() == list(range(5))
    assert second.offsets(CONTROL) == [0, 1]
    assert [r.value for r in first.taken] == [b"v%d" % i for i in range(7)]
    assert {r.origin.partition for r in first.taken} == {0}


async def test_only_committed_records_are_taken_and_none_past_an_open_transaction(
    running: Any,
) -> None:
    bench = Bench([0])
    owner = bench.own(0)
    bench.put(0, 2)
    producer = bench.kafka.producer("other")
    await producer.start()
    await producer.begin()
    await producer.send(COMMANDS, 0, [OutRecord(COMMANDS, b"s", b"open")])
    bench.put(0, 1)
    running(bench.loop())
    await until(lambda: len(owner.taken) == 2, "the records before the open batch")
    fetches = bench.input.fetches
    await until(lambda: bench.input.fetches > fetches + 3, "more fetches")
    assert owner.offsets() == [0, 1]
    await producer.abort()
    await until(lambda: len(owner.taken) == 3, "the record after the aborted batch")
    assert owner.offsets() == [0, 1, 3]


async def test_records_of_a_partition_owned_elsewhere_are_not_taken(running: Any) -> None:
    bench = Bench()
    owner = bench.own(0)
    bench.put(1, 4)
    bench.put(0, 3)
    running(bench.loop())
    await until(lambda: len(owner.taken) == 3, "partition 0's records")
    await until(lambda: bench.input.positions[TopicPartition(COMMANDS, 1)] == 4, "p1 fetched")
    assert owner.offsets() == [0, 1, 2]
    assert bench.inflight.count == 3  # only what an owner took is in flight


async def test_the_in_flight_bound_pauses_every_partition_and_fetching_goes_on(
    running: Any,
) -> None:
    bench = Bench(limit=2)
    owner = bench.own(0)
    bench.put(0, 5)
    bench.put(1, 3)
    loop = bench.loop(max_records=1)
    running(loop)
    await until(lambda: loop.paused, "the pause")
    assert bench.input.paused() == bench.input.assignment()  # the unowned partition too
    taken = len(owner.taken)
    assert taken == 2
    seen = bench.input.fetched_while_paused
    await until(lambda: bench.input.fetched_while_paused >= seen + 5, "fetches while paused")
    assert len(owner.taken) == taken  # nothing taken, nothing dropped
    while len(owner.taken) < 5:
        bench.inflight.count = 0  # the work in flight committed: fetching resumes
        await until(lambda: len(owner.taken) == 5 or bench.inflight.full, "more records")
    assert owner.offsets() == [0, 1, 2, 3, 4]


async def test_the_fetch_resumes_as_soon_as_the_count_drops_below_the_bound(
    running: Any,
) -> None:
    bench = Bench([0], limit=3)
    owner = bench.own(0)
    bench.put(0, 4)
    loop = bench.loop(max_records=1)
    running(loop)
    await until(lambda: loop.paused, "the pause")
    bench.inflight.count -= 1  # one command committed: below the bound again
    await until(lambda: len(owner.taken) == 4, "the fourth record")
    assert bench.input.paused() == bench.input.assignment()  # full again: paused again
    assert owner.offsets() == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "call", ["input.fetch", "input.assignment", "input.paused", "input.pause", "input.resume"]
)
async def test_a_failed_call_of_the_input_ends_the_loop_with_its_error(call: str) -> None:
    bench = Bench([0], limit=2)
    owner = bench.own(0)
    bench.put(0, 4)
    error = KafkaConnectionError(f"{call} failed")
    loop = bench.loop(max_records=1)
    # Reached at the first fetch, on the way to the pause, or on the way back.
    after = {"input.fetch": 1}.get(call, 0)
    bench.kafka.fail(call, error, after=after)
    task = asyncio.create_task(loop.run())
    if call == "input.resume":
        await until(lambda: loop.paused, "the pause")
        bench.inflight.count = 0
    with pytest.raises(KafkaConnectionError) as raised:
        async with asyncio.timeout(5):
            await task
    assert raised.value is error
    assert owner.offsets() == list(range(len(owner.taken)))  # what was taken stays in order
    assert bench.kafka.fired and bench.kafka.fired[-1][1] == call


def test_every_call_of_the_input_the_loop_makes_failed_in_a_test_above(
    request: pytest.FixtureRequest,
) -> None:
    assert_every_call_failed(
        request,
        InputSource,
        elsewhere={
            "InputSource.seek": "the partition owner's (test_owner_rules)",
            "InputSource.beginning_offsets": "the partition owner's (test_owner_rules)",
        },
    )
