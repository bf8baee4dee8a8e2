"""The local session store restored from the sessions topic: from an empty store and from a
warm one (a store that saw part of the changelog), the result is the same, record for record;
a store its last owner did not close cleanly is not trusted."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition

from service.agent.state import PendingBatch, SessionState
from service.runtime import restore
from service.runtime.restore import SessionsReader, partition_of
from service.runtime.topics import create_topics
from service.sessions import history
from service.sessions.cache import SessionCache
from service.sessions.store import SessionStore, event_seq_header
from service.sessions.table import MemoryTable, SqliteTable
from service.sessions.writer import SessionWriter
from service.settings import KafkaSettings, TopicSettings
from tests.support.runtime_harness import unique

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]

RECORD_MAX = 8_000


def _steps(sessions: int, steps: int) -> list[tuple[bytes, bytes | None, int]]:
    """The changelog records of ``steps`` writes of each of ``sessions`` sessions, in the order
    a runtime writes them (sessions interleaved; messages split, results, rollbacks)."""
    writer = SessionWriter(SessionStore(MemoryTable()), record_max_bytes=RECORD_MAX)
    states = {f"s{i}": SessionState(session_id=f"s{i}", agent="a") for i in range(sessions)}
    records: list[tuple[bytes, bytes | None, int]] = []
    for step in range(steps):
        for session_id, state in list(states.items()):
            state = state.snapshot()
            if step % 5 == 4:
                del state.messages[-1:]
            else:
                text = f"{session_id} step {step} " * (30 if step % 3 else 700)
                state.messages.append({"role": "user", "content": [{"text": text}]})
            if step % 4 == 2:
                use = {"toolUse": {"toolUseId": f"t{step}", "name": "x", "input": {}}}
                state.pending = PendingBatch({"role": "assistant", "content": [use]})
                state.pending.results[f"t{step}"] = {
                    "toolResult": {"toolUseId": f"t{step}", "status": "success", "content": []}
                }
            else:
                state.pending = None
            states[session_id] = state
            write = writer.write(state, step)
            records.extend((key, value, step) for key, value in write.records)
    return records


async def _produce(
    bootstrap: str,
    topic: str,
    records: list[tuple[bytes, bytes | None, int]],
    partition: int = 0,
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        for key, value, seq in records:
            await producer.send(
                topic, key=key, value=value, partition=partition, headers=[event_seq_header(seq)]
            )
        await producer.flush()
    finally:
        await producer.stop()


async def _topics(bootstrap: str, partitions: int = 1) -> tuple[TopicSettings, KafkaSettings]:
    """Fresh topics of ``partitions`` partitions each."""
    topics = TopicSettings(
        commands=unique("c"),
        control=unique("k"),
        results=unique("r"),
        events=unique("e"),
        sessions=unique("sessions"),
        dlq=unique("d"),
        partitions=partitions,
    )
    kafka = KafkaSettings(bootstrap_servers=bootstrap)
    await create_topics(kafka, topics)
    return topics, kafka


def _rows(folder: Path) -> list[tuple[bytes, bytes, int]]:
    with sqlite3.connect(folder / "store.sqlite") as db:
        return list(db.execute("SELECT key, value, seq FROM kv ORDER BY key"))


async def test_a_warm_store_restores_to_the_same_records_as_an_empty_one(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topics, kafka = await _topics(kafka_bootstrap)
    records = _steps(sessions=6, steps=12)
    half = len(records) // 2
    reader = SessionsReader(kafka, topics.sessions)
    try:
        await _produce(kafka_bootstrap, topics.sessions, records[:half])
        warm = SqliteTable(tmp_path / "warm", max_age_s=3600)
        await reader.restore(0, warm, cache=SessionCache(1 << 20))
        warm.mark_clean()
        warm.close()
        await _produce(kafka_bootstrap, topics.sessions, records[half:])
        warm = SqliteTable(tmp_path / "warm", max_age_s=3600)
        assert warm.position == half, "a cleanly closed store keeps its position"
        warm_store = await reader.restore(0, warm, cache=SessionCache(1 << 20))
        cold = SqliteTable(tmp_path / "cold", max_age_s=3600)
        cold_store = await reader.restore(0, cold, cache=SessionCache(1 << 20))
        for i in range(6):
            got_warm, got_cold = warm_store.get(f"s{i}"), cold_store.get(f"s{i}")
            assert got_warm is not None and got_cold is not None
            assert got_warm.state == got_cold.state
        warm.close()
        cold.close()
        assert _rows(tmp_path / "warm") == _rows(tmp_path / "cold")
        # Not closed cleanly (a crash, a failed owner): wiped and read again from the start.
        again = SqliteTable(tmp_path / "warm", max_age_s=3600)
        again.close()
        reopened = SqliteTable(tmp_path / "warm", max_age_s=3600)
        assert reopened.position == 0
        reopened.close()
    finally:
        await reader.close()


async def test_reads_of_any_topic_leave_no_partition_fetched(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The repair reads topics other than the one restored; and a reader keeps fetching an
    assigned partition in the background: after a restore, a fork's read or the repair's
    reads, every partition it holds is paused (an idle service that kept one fetched it a
    hundred times a second)."""
    topics, kafka = await _topics(kafka_bootstrap)
    await _produce(kafka_bootstrap, topics.sessions, _steps(sessions=2, steps=3))
    reader = SessionsReader(kafka, topics.sessions)
    tp = TopicPartition(topics.sessions, 0)

    def assigned() -> set[TopicPartition]:
        """What the readers fetch in the background."""
        readers = (reader._consumer, reader._uncommitted, reader._forks)
        return {tp for r in readers if r is not None for tp in r.assignment() - r.paused()}

    try:
        table = SqliteTable(tmp_path / "store", max_age_s=3600)
        store = await reader.restore(0, table, cache=SessionCache(1 << 20))
        assert store.get("s1") is not None
        assert assigned() == set()
        # Topics it never read: their partition counts come from the broker, not a reader's
        # metadata (which knows only what it has assigned).
        assert await reader.partition_for(topics.events, "s1") == 0
        assert await reader.partition_for(topics.results, "s1") == 0
        assert await reader.session_records("s1")
        assert assigned() == set()
        assert await reader.committed_tail(tp, 100)
        assert assigned() == set()
        stable, end = (await reader.stable_and_end([tp]))[tp]
        assert stable == end
        assert await reader.read_open(tp, 0, end)
        assert assigned() == set()
        table.close()
    finally:
        await reader.close()


def _hold_reads_of(
    partition: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[asyncio.Event, asyncio.Event]:
    """Reads of the changelog's ``partition`` start only once the first event (the gate) is set;
    the second is set as one begins to wait."""
    gate, reading = asyncio.Event(), asyncio.Event()
    read = restore.KafkaChangelog.read

    async def held(
        self: restore.KafkaChangelog, tp: TopicPartition, start: int, end: int
    ) -> AsyncIterator[list[restore.ChangelogRecord]]:
        if tp.partition == partition:
            reading.set()
            await gate.wait()
        async for fetched in read(self, tp, start, end):
            yield fetched

    monkeypatch.setattr(restore.KafkaChangelog, "read", held)
    return gate, reading


async def test_a_restore_does_not_wait_for_a_forks_read(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork reads the whole partition of its source; meanwhile the instance restores its other
    partitions (a takeover), which must not wait for that read to end."""
    topics, kafka = await _topics(kafka_bootstrap, partitions=2)
    source = partition_of("s1", 2)
    other = 1 - source
    records = _steps(sessions=2, steps=3)
    for partition in (source, other):
        await _produce(kafka_bootstrap, topics.sessions, records, partition)
    gate, reading = _hold_reads_of(source, monkeypatch)
    reader = SessionsReader(kafka, topics.sessions)
    try:
        fork = asyncio.create_task(reader.session_records("s1"))
        async with asyncio.timeout(30):
            await reading.wait()
        table = SqliteTable(tmp_path / "store", max_age_s=3600)
        async with asyncio.timeout(10):
            store = await reader.restore(other, table, cache=SessionCache(1 << 20))
        assert not fork.done(), "the fork's read is still held"
        assert store.get("s1") is not None
        gate.set()
        async with asyncio.timeout(30):
            found = await fork
        assert found.get(b"s1"), "the fork's read found the source's head"
        table.close()
    finally:
        gate.set()
        await reader.close()


async def test_a_cold_restore_holds_up_neither_the_other_restores_nor_the_starts(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A takeover: one partition restores from an empty store for seconds while the instance's
    other partitions, warm or small, start beside it (their lookups, their own restores), and
    they serve without waiting for it."""
    topics, kafka = await _topics(kafka_bootstrap, partitions=3)
    records = _steps(sessions=2, steps=3)
    for partition in range(3):
        await _produce(kafka_bootstrap, topics.sessions, records, partition)
    gate, reading = _hold_reads_of(0, monkeypatch)
    reader = SessionsReader(kafka, topics.sessions)
    tables = [SqliteTable(tmp_path / f"store-{p}", max_age_s=3600) for p in range(3)]
    cache = SessionCache(1 << 20)
    try:
        cold = asyncio.create_task(reader.restore(0, tables[0], cache=cache))
        async with asyncio.timeout(30):
            await reading.wait()
        async with asyncio.timeout(10):
            for partition in (1, 2):
                store = await reader.restore(partition, tables[partition], cache=cache)
                assert store.get("s1") is not None
            bounds = await reader.stable_and_end([TopicPartition(topics.sessions, 0)])
        assert not cold.done(), "the cold restore is still held"
        assert bounds[TopicPartition(topics.sessions, 0)][0] > 0
        gate.set()
        async with asyncio.timeout(30):
            store = await cold
        assert store.get("s1") is not None
    finally:
        gate.set()
        await reader.close()
        for table in tables:
            table.close()


async def test_long_restores_read_one_at_a_time_beside_short_ones(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two cold partitions with much to read and one with little: the second long read starts
    only once the first has ended (so the first serves after its own read, not after both),
    while the short one serves at once, beside the first."""
    topics, kafka = await _topics(kafka_bootstrap, partitions=3)
    records = _steps(sessions=2, steps=3)
    for partition in (0, 1):
        await _produce(kafka_bootstrap, topics.sessions, records, partition)
    await _produce(kafka_bootstrap, topics.sessions, records[:2], 2)
    monkeypatch.setattr(restore, "LONG_RESTORE_OFFSETS", 2)
    gate, reading = _hold_reads_of(0, monkeypatch)
    reads: list[tuple[int, str]] = []
    held = restore.KafkaChangelog.read

    async def logged(
        self: restore.KafkaChangelog, tp: TopicPartition, start: int, end: int
    ) -> AsyncIterator[list[restore.ChangelogRecord]]:
        reads.append((tp.partition, "start"))
        async for fetched in held(self, tp, start, end):
            yield fetched
        reads.append((tp.partition, "end"))

    monkeypatch.setattr(restore.KafkaChangelog, "read", logged)
    reader = SessionsReader(kafka, topics.sessions)
    tables = [SqliteTable(tmp_path / f"store-{p}", max_age_s=3600) for p in range(3)]
    cache = SessionCache(1 << 20)
    try:
        first = asyncio.create_task(reader.restore(0, tables[0], cache=cache))
        async with asyncio.timeout(30):
            await reading.wait()
        second = asyncio.create_task(reader.restore(1, tables[1], cache=cache))
        async with asyncio.timeout(10):
            await reader.restore(2, tables[2], cache=cache)
        assert tables[2].position == 2
        assert not first.done() and not second.done()
        assert (1, "start") not in reads, "the second long restore waits for the first"
        gate.set()
        async with asyncio.timeout(30):
            stores = await asyncio.gather(first, second)
        assert all(store.get("s1") is not None for store in stores)
        assert reads.index((0, "end")) < reads.index((1, "start"))
    finally:
        gate.set()
        await reader.close()
        for table in tables:
            table.close()


def _last_records(
    records: list[tuple[bytes, bytes | None, int]], session: str
) -> dict[bytes, bytes]:
    """What a read of the whole changelog finds for ``session``: each key's last value."""
    found: dict[bytes, bytes] = {}
    for key, value, _ in records:
        if history.head_key_of(key) == session.encode():
            if value is None:
                found.pop(key, None)
            else:
                found[key] = value
    return found


async def test_forks_that_wait_for_one_partition_are_served_by_one_read(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forks read one at a time; those that asked while a read of the partition was under way
    share the next read, and one that asks once a read has started is not served by it (that
    read's end may be older than what it must see)."""
    topics, kafka = await _topics(kafka_bootstrap)
    records = _steps(sessions=4, steps=3)
    await _produce(kafka_bootstrap, topics.sessions, records)
    gates = [asyncio.Event(), asyncio.Event()]
    started_reads: list[asyncio.Event] = [asyncio.Event() for _ in range(8)]
    reads = 0
    read = restore.KafkaChangelog.read

    async def held(
        self: restore.KafkaChangelog, tp: TopicPartition, start: int, end: int
    ) -> AsyncIterator[list[restore.ChangelogRecord]]:
        nonlocal reads
        reads += 1
        started_reads[reads - 1].set()
        if reads <= len(gates):
            await gates[reads - 1].wait()
        async for fetched in read(self, tp, start, end):
            yield fetched

    monkeypatch.setattr(restore.KafkaChangelog, "read", held)
    reader = SessionsReader(kafka, topics.sessions)
    try:
        first = asyncio.create_task(reader.session_records("s0"))
        async with asyncio.timeout(30):
            await started_reads[0].wait()
        queued = {s: asyncio.create_task(reader.session_records(s)) for s in ("s1", "s2", "s3")}
        await asyncio.sleep(0)  # each runs until it waits for its read
        gates[0].set()
        async with asyncio.timeout(30):
            await started_reads[1].wait()
        # Written after the second read took its end: a fork asking now must see it.
        late = (history.message_key("s1", 99), b"late", 99)
        await _produce(kafka_bootstrap, topics.sessions, [late])
        after = asyncio.create_task(reader.session_records("s1"))
        gates[1].set()
        async with asyncio.timeout(30):
            assert await first == _last_records(records, "s0")
            for session, task in queued.items():
                assert await task == _last_records(records, session)
            assert await after == _last_records([*records, late], "s1")
        assert reads == 3, "the three forks that waited shared one read; the late one had its own"
    finally:
        for gate in gates:
            gate.set()
        await reader.close()


async def test_a_read_no_fork_waits_for_is_cancelled_and_close_ends_every_read(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork's owner that stops (a revoke) stops waiting: a read nobody waits for is cancelled,
    and a later fork gets a read of its own. ``close`` cancels the reads running or queued, and
    no reader is started after it."""
    topics, kafka = await _topics(kafka_bootstrap)
    records = _steps(sessions=2, steps=2)
    await _produce(kafka_bootstrap, topics.sessions, records)
    gate = asyncio.Event()
    starts: list[asyncio.Event] = [asyncio.Event() for _ in range(4)]
    cancelled: list[int] = []
    read = restore.KafkaChangelog.read

    async def held(
        self: restore.KafkaChangelog, tp: TopicPartition, start: int, end: int
    ) -> AsyncIterator[list[restore.ChangelogRecord]]:
        number = sum(event.is_set() for event in starts)
        starts[number].set()
        try:
            if number != 1:
                await gate.wait()
        except asyncio.CancelledError:
            cancelled.append(number)
            raise
        async for fetched in read(self, tp, start, end):
            yield fetched

    monkeypatch.setattr(restore.KafkaChangelog, "read", held)
    reader = SessionsReader(kafka, topics.sessions)
    closed = False
    try:
        alone = asyncio.create_task(reader.session_records("s0"))
        async with asyncio.timeout(30):
            await starts[0].wait()
        alone.cancel()
        async with asyncio.timeout(30):
            assert await asyncio.gather(alone, return_exceptions=True) != [None]
            while cancelled != [0]:
                await asyncio.sleep(0.01)
            # The next fork has a read of its own (read 1, not held), not the cancelled one.
            assert await reader.session_records("s1") == _last_records(records, "s1")
        running = asyncio.create_task(reader.session_records("s0"))
        async with asyncio.timeout(30):
            await starts[2].wait()
        queued = asyncio.create_task(reader.session_records("s1"))
        await asyncio.sleep(0)  # it waits for the next read
        async with asyncio.timeout(30):
            await reader.close()
        closed = True
        outcomes = await asyncio.gather(running, queued, return_exceptions=True)
        assert all(isinstance(o, asyncio.CancelledError) for o in outcomes), outcomes
        assert cancelled == [0, 2] and not starts[3].is_set()
        assert reader._forks is None, "no reader started after close"
    finally:
        gate.set()
        if not closed:
            await reader.close()
