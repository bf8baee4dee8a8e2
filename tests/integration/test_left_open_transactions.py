"""Transactions left open on a partition an owner writes, repaired before the owner serves.

A broker restart can leave an earlier owner's batches without a marker (see docs/runtime.md,
"Across broker restarts"). Made here on purpose, on a broker of the test's own that does not
verify transactional produces: an open result the committed session state records as answered
must become visible exactly once, an open result it does not record must never become visible,
and the partition must answer what follows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer, TopicPartition

from service.runtime.offset_fetch import UNSTABLE_OFFSET_COMMIT
from service.sessions.codec import encode_state
from service.sessions.store import event_seq_header
from tests.support.own_broker import OwnBroker, own_broker
from tests.support.runtime_harness import (
    Client,
    Cluster,
    invoke,
    last_stored_session,
    services,
    unique,
)
from tests.support.txn_probe import (
    VERIFICATION_OFF,
    fabricate_hanging_transaction,
    fabricate_partial_commit,
    fabricate_pending_offsets,
    fence,
    group_offsets,
    offsets_writer,
    partition_offsets,
    stable_and_high,
    stable_group_offset,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnBroker]:
    """One broker for the module: each test has its own topics, group and transactional ids."""
    with own_broker(tmp_path_factory.mktemp("kafka"), VERIFICATION_OFF) as broker:
        yield broker


def result_value(session_id: str, command_id: str) -> bytes:
    return orjson.dumps(
        {
            "type": "agent_result",
            "schema_version": 1,
            "session_id": session_id,
            "command_id": command_id,
            "message": {"role": "assistant", "content": [{"text": "left open"}]},
            "stop_reason": "end_turn",
            "checkpoint": None,
            "interrupts": None,
            "metrics": {},
            "state": {},
            "error": None,
            "metadata": {},
        }
    )


async def answered_and_stopped(cluster: Cluster, command: dict[str, object]) -> None:
    """One instance answers ``command`` and stops cleanly."""
    with services() as procs:
        proc = cluster.start("first")
        procs.append(proc)
        await proc.wait_ready()
        async with Client(cluster) as client:
            await client.send(command)
            await client.result(str(command["command_id"]), 60, alive=proc)
        assert await proc.terminate() == 0


async def test_open_results_are_published_when_the_state_vouches_for_them(
    tmp_path: Path,
    broker: OwnBroker,
) -> None:
    cluster = Cluster(broker.bootstrap, tmp_path, partitions=1)
    await cluster.create_topics()
    session = unique("s")
    first = invoke(session, "hello", agent="simple")
    answered, redone, after = unique("c"), unique("c"), unique("c")
    await answered_and_stopped(cluster, first)

    # A step that was committed, whose result lost its marker: the state lists it as
    # applied. And a result of a step that never committed: the state does not.
    stored = await last_stored_session(cluster, session)
    delivery = stored.delivery.applying(answered)
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(
            cluster.topics.sessions,
            encode_state(stored.state, delivery),
            key=session.encode(),
            partition=0,
            headers=[event_seq_header(stored.event_seq)],
        )
    finally:
        await producer.stop()
    results = TopicPartition(cluster.topics.results, 0)
    # The earlier owner's producer: the one its committed offsets name.
    commands = TopicPartition(cluster.topics.commands, 0)
    transactional_id = await offsets_writer(broker.bootstrap, cluster.group, commands)
    for command_id in (answered, redone):
        await fabricate_hanging_transaction(
            broker.bootstrap,
            transactional_id,
            results,
            key=session.encode(),
            value=result_value(session, command_id),
        )
    stable, end = await partition_offsets(broker.bootstrap, results)
    assert stable < end

    with services() as procs:
        proc = cluster.start("second")
        procs.append(proc)
        await proc.wait_ready()
        async with Client(cluster) as client:
            await client.send(invoke(session, "and now?", agent="simple", command_id=after))
            await client.result(after, 60, alive=proc)
            await client.result(answered, 30, alive=proc)
            await client.caught_up()
            assert len(client.results_for(answered)) == 1
            assert client.results_for(redone) == []
            assert len(client.results_for(after)) == 1
        stable, end = await partition_offsets(broker.bootstrap, results)
        assert stable == end
        assert proc.alive, proc.text()[-3000:]


def event_value(session_id: str, command_id: str, seq: int) -> bytes:
    return orjson.dumps(
        {
            "type": "text_delta",
            "schema_version": 1,
            "session_id": session_id,
            "command_id": command_id,
            "seq": seq,
            "text": "left open",
        }
    )


async def test_a_step_committed_but_on_the_sessions_topic_is_kept_not_redone(
    tmp_path: Path,
    broker: OwnBroker,
) -> None:
    """A restart can drop a committed transaction's marker on some of its partitions only: the
    step's result and events are visible, its session records are left open. The new owner
    must keep the step (publish its session records again), not abort it and redo it: the
    command sent again is a duplicate, and the events after it take new seqs."""
    cluster = Cluster(broker.bootstrap, tmp_path, partitions=1)
    await cluster.create_topics()
    session, step, after = unique("s"), unique("c"), unique("c")
    await answered_and_stopped(cluster, invoke(session, "hello", agent="simple"))

    stored = await last_stored_session(cluster, session)
    seq = stored.event_seq
    state = replace(
        stored.state,
        messages=[
            *stored.state.messages,
            {"role": "user", "content": [{"text": "more"}]},
            {"role": "assistant", "content": [{"text": "left open"}]},
        ],
    )
    head = encode_state(state, stored.delivery.applying(step))
    sessions = TopicPartition(cluster.topics.sessions, 0)
    results = TopicPartition(cluster.topics.results, 0)
    events = TopicPartition(cluster.topics.events, 0)
    commands = TopicPartition(cluster.topics.commands, 0)
    await fabricate_partial_commit(
        broker.bootstrap,
        await offsets_writer(broker.bootstrap, cluster.group, commands),
        [
            (events, session.encode(), event_value(session, step, seq + 1)),
            (events, session.encode(), event_value(session, step, seq + 2)),
            (results, session.encode(), result_value(session, step)),
        ],
        sessions,
        [(session.encode(), head, [event_seq_header(seq + 2)])],
    )
    found = await stable_and_high(broker.bootstrap, [sessions, results, events])
    assert [stable < end for stable, end in found.values()] == [True, False, False]

    with services() as procs:
        proc = cluster.start("second")
        procs.append(proc)
        await proc.wait_ready()
        async with Client(cluster) as client:
            await client.send(
                invoke(session, "more", agent="simple", command_id=step),
                invoke(session, "and now?", agent="simple", command_id=after),
            )
            await client.result(after, 60, alive=proc)
            await client.caught_up()
            assert len(client.results_for(step)) == 1
            assert len(client.results_for(after)) == 1
            seqs = [e["seq"] for e in client.events if e["session_id"] == session]
            assert len(seqs) == len(set(seqs)), f"event seqs published twice: {seqs}"
            assert min(e["seq"] for e in client.events if e["command_id"] == after) > seq + 2
        found = await stable_and_high(broker.bootstrap, [sessions])
        assert [stable == end for stable, end in found.values()] == [True]
        assert proc.alive, proc.text()[-3000:]


async def test_a_batch_left_open_while_the_owner_serves_is_repaired_without_a_new_command(
    tmp_path: Path,
    broker: OwnBroker,
) -> None:
    """A commit the broker acknowledged and then lost the markers of leaves a running owner with
    nothing to notice: it is idle, its records stay invisible. It must see the gap outlive any
    commit of its own and have the partition repaired (the unvouched result never shows)."""
    cluster = Cluster(broker.bootstrap, tmp_path, partitions=1)
    await cluster.create_topics()
    session, lost = unique("s"), unique("c")
    results = TopicPartition(cluster.topics.results, 0)
    with services() as procs:
        # The gap counts as lost once it outlives the owner's commit timeout (15 s by
        # default) and one look of the watch: a shorter timeout makes the wait shorter.
        proc = cluster.start("only", CAIRN_RUNTIME__COMMIT_TIMEOUT_S="4")
        procs.append(proc)
        await proc.wait_ready()
        async with Client(cluster) as client:
            first = invoke(session, "hello", agent="simple")
            await client.send(first)
            await client.result(first["command_id"], 60, alive=proc)
            commands = TopicPartition(cluster.topics.commands, 0)
            await fabricate_hanging_transaction(
                broker.bootstrap,
                await offsets_writer(broker.bootstrap, cluster.group, commands),
                results,
                key=session.encode(),
                value=result_value(session, lost),
            )

            async def repaired() -> bool:
                stable, end = await partition_offsets(broker.bootstrap, results)
                return stable == end

            deadline = asyncio.get_running_loop().time() + 90
            while not await repaired():
                assert proc.alive, proc.text()[-3000:]
                assert asyncio.get_running_loop().time() < deadline, "never repaired"
                await asyncio.sleep(0.5)
            after = invoke(session, "still there?", agent="simple")
            await client.send(after)
            await client.result(after["command_id"], 60, alive=proc)
            await client.caught_up()
            assert client.results_for(lost) == []
            assert len(client.results_for(first["command_id"])) == 1


async def test_offsets_left_pending_by_lost_markers_are_released_and_the_partition_served(
    tmp_path: Path,
    broker: OwnBroker,
) -> None:
    """A broker restart can complete a transaction and lose its markers, the one to the group's
    offsets partition among them: the input offsets then stay pending, and no InitProducerId
    ends them, not even the next owner's of the same transactional id. The next owner must
    release them (an abort of that producer id with the group's offsets) and serve, answering
    what it reads again from the session state: no command twice."""
    cluster = Cluster(broker.bootstrap, tmp_path, partitions=1)
    await cluster.create_topics()
    session = unique("s")
    first = invoke(session, "hello", agent="simple")
    await answered_and_stopped(cluster, first)

    commands = TopicPartition(cluster.topics.commands, 0)
    writer = await offsets_writer(broker.bootstrap, cluster.group, commands)
    committed = await stable_group_offset(broker.bootstrap, cluster.group, commands)
    await fabricate_pending_offsets(
        broker.bootstrap, writer, cluster.group, commands, committed + 5
    )
    await fence(broker.bootstrap, writer)
    [(_, _, error)] = (
        await group_offsets(broker.bootstrap, cluster.group, [commands], require_stable=True)
    ).values()
    assert error == UNSTABLE_OFFSET_COMMIT, "a new epoch of the writer ended the offsets"

    with services() as procs:
        proc = cluster.start("second")
        procs.append(proc)
        # Unreleased, the owner would wait out the transaction timeout (20 s) and fail,
        # again and again.
        await proc.wait_ready(timeout=15)
        async with Client(cluster) as client:
            after = invoke(session, "and now?", agent="simple")
            await client.send(after)
            await client.result(after["command_id"], 60, alive=proc)
            await client.caught_up()
            assert len(client.results_for(first["command_id"])) == 1
            assert len(client.results_for(after["command_id"])) == 1
        assert await proc.terminate() == 0, proc.text()[-3000:]
    # The released offsets went back to the last commit, the drain's moved them past both.
    assert await stable_group_offset(broker.bootstrap, cluster.group, commands) == committed + 1
