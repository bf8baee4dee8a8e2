"""The restore of a partition's session table from its changelog, on an in-memory changelog: a
cold and a warm start, a table the topic cannot have produced, transaction markers, deletes, and
a failure at each call that leaves the table where a next restore goes on from."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError

from service.runtime.restore import Changelog, catch_up
from service.sessions.table import MemoryTable
from tests.support.memory_kafka import MemoryChangelog, assert_every_call_failed

pytestmark = pytest.mark.timeout(10)

TOPIC = "t.sessions"
TP = TopicPartition(TOPIC, 1)


def filled(count: int) -> MemoryChangelog:
    changelog = MemoryChangelog()
    for index in range(count):
        changelog.append(TP, b"s%d" % index, b"v%d" % index, seq=index + 1)
    return changelog


async def test_a_cold_restore_reads_everything_up_to_the_end() -> None:
    changelog, table = filled(5), MemoryTable()
    assert await catch_up(changelog, TOPIC, 1, table) == 5
    assert table.position == 5
    assert table.get(b"s3") == (b"v3", 4)
    assert table.heads() == 5


async def test_a_warm_restore_reads_only_the_tail() -> None:
    changelog, table = filled(5), MemoryTable()
    await catch_up(changelog, TOPIC, 1, table)
    changelog.append(TP, b"s1", b"new", seq=9)
    changelog.append(TP, b"s0", None)
    assert await catch_up(changelog, TOPIC, 1, table) == 2
    assert changelog.reads[-1] == (5, 7)
    assert table.get(b"s1") == (b"new", 9)
    assert table.get(b"s0") is None
    assert table.position == 7


async def test_markers_at_the_end_still_bring_the_position_to_the_end() -> None:
    changelog, table = filled(3), MemoryTable()
    changelog.marker(TP)
    assert await catch_up(changelog, TOPIC, 1, table) == 3
    assert table.position == 4
    assert await catch_up(changelog, TOPIC, 1, table) == 0
    assert changelog.reads[-1] == (4, 4)


@pytest.mark.parametrize(
    ("position", "start", "end"), [(9, 0, 5), (2, 3, 5)], ids=["past-the-end", "before-start"]
)
async def test_a_table_the_topic_cannot_have_produced_is_wiped_and_read_again(
    position: int, start: int, end: int
) -> None:
    changelog, table = filled(end), MemoryTable()
    changelog.start[TP] = start
    table.apply([(b"stale", b"x", 0, 0)], position)
    records = await catch_up(changelog, TOPIC, 1, table)
    assert table.get(b"stale") is None
    assert records == end - start
    assert table.position == end


async def test_a_failed_bounds_lookup_changes_nothing() -> None:
    changelog, table = filled(4), MemoryTable()
    changelog.fail("bounds", KafkaConnectionError("broker away"))
    with pytest.raises(KafkaConnectionError):
        await catch_up(changelog, TOPIC, 1, table)
    assert table.position == 0
    assert await catch_up(changelog, TOPIC, 1, table) == 4


async def test_a_read_failing_midway_keeps_what_was_applied_and_the_next_restore_goes_on() -> None:
    changelog, table = filled(6), MemoryTable()
    await catch_up(changelog, TOPIC, 1, table)  # warm
    for index in range(6, 12):
        changelog.append(TP, b"s%d" % index, b"v%d" % index)
    changelog.fail("batch", KafkaConnectionError("connection lost"), after=1)
    with pytest.raises(KafkaConnectionError):
        await catch_up(changelog, TOPIC, 1, table)
    assert table.position == 8  # the tail's first batch (offsets 6 and 7) is in
    assert await catch_up(changelog, TOPIC, 1, table) == 4
    assert changelog.reads[-1] == (8, 12)
    assert table.position == 12
    assert table.get(b"s11") == (b"v11", 0)


async def test_the_event_loop_runs_between_the_batches_a_restore_applies() -> None:
    """A reader whose next batch is already buffered hands it over without suspending: the
    restore gives the loop back after each batch, so the instance's other partitions are served
    meanwhile instead of after the whole read."""
    changelog, table = filled(10), MemoryTable()
    seen: list[int] = []
    reading = True

    async def watch() -> None:
        while reading:
            seen.append(table.position)
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0)
    assert await catch_up(changelog, TOPIC, 1, table) == 10
    reading = False
    await watcher
    assert {2, 4, 6, 8} <= set(seen), seen


def test_every_call_of_the_changelog_failed_in_a_test_above(request: pytest.FixtureRequest) -> None:
    assert_every_call_failed(request, Changelog)
