"""The partition owner on the in-memory Kafka, with the real consumer loop, transaction stream,
committer, command path and engine: its start sequence (stable offsets, fencing the writer they
name, open transactions ended, seek, restore, claim), its offset bookkeeping, its exits (fenced,
failed, stopped with a grace period and a last commit), and a failure injected at every call it
makes of Kafka, each ending in the documented exit with nothing committed that was not done and
no command lost: a re-created owner answers every command exactly once."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.errors import KafkaConnectionError, ProducerFenced
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from service.runtime import cancels, idle_expiry, partition_owner
from service.runtime.committer import Committer
from service.runtime.partition_owner import OwnerExit, PartitionOwner
from service.runtime.restore import Sessions
from service.runtime.transport import (
    GroupFencedError,
    GroupOffsets,
    InputSource,
    Transport,
    TxnProducer,
)
from service.runtime.work import InputRecord, Origin, OutRecord
from service.sessions.delivery import APPLIED_KEPT
from service.sessions.store import SessionStore
from tests.support.memory_kafka import (
    Entry,
    MemoryKafka,
    assert_every_call_failed,
)
from tests.support.owner_harness import (
    COMMANDS_0,
    CONTROL_0,
    GROUP,
    OLD,
    OURS,
    TOPICS,
    Instance,
    answered,
    command,
    committed,
    first,
    put,
    shorten_waits,
    until,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def short_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    shorten_waits(monkeypatch)


async def test_a_new_owner_seeks_restores_and_claims_before_any_work(tmp_path: Path) -> None:
    kafka = MemoryKafka()
    put(kafka, *(command(i) for i in range(3)))
    async with Instance(kafka, tmp_path) as instance:
        owner, task = instance.owner()
        await until(lambda: committed(kafka) == 3, "every command committed")
        assert await instance.stop(owner, task) is OwnerExit.STOPPED
    assert answered(kafka) == Counter({"c0": 1, "c1": 1, "c2": 1})
    stable = first(kafka, "group", "fetch")
    assert stable < first(kafka, "sessions", "sessions.stable_and_end")
    assert first(kafka, "sessions", "sessions.stable_and_end") < first(kafka, "input", "input.seek")
    assert first(kafka, "input", "input.seek") < first(kafka, "sessions", "sessions.restore")
    claim = first(kafka, OURS, "commit")
    assert first(kafka, "sessions", "sessions.restore") < claim < first(kafka, OURS, "send")
    # Nothing committed before: the offsets start where the topics begin, and name our producer.
    assert kafka.committed == {COMMANDS_0: (3, OURS), CONTROL_0: (0, OURS)}


async def test_a_new_owner_starts_from_the_committed_offsets_not_from_where_fetching_was(
    tmp_path: Path,
) -> None:
    kafka = MemoryKafka()
    put(kafka, *(command(i) for i in range(4)))
    kafka.committed[COMMANDS_0] = (2, OLD)
    async with Instance(kafka, tmp_path) as instance:
        instance.input.positions[COMMANDS_0] = 0  # fetched from the start before the owner
        owner, task = instance.owner()
        await until(lambda: committed(kafka) == 4, "the commands after the committed offset")
        assert await instance.stop(owner, task) is OwnerExit.STOPPED
    assert answered(kafka) == Counter({"c2": 1, "c3": 1})


@pytest.mark.parametrize("partition_streams", [False, True], ids=["instance", "partition"])
async def test_an_answer_of_the_group_offsets_without_the_partition_is_no_start(
    tmp_path: Path, partition_streams: bool
) -> None:
    """Right after a broker restart the coordinator answers the offset fetch with a group-level
    error and no partition. An owner read that as a start of nowhere and took records from
    where the consumer was: the commands its failed predecessor had fetched (c2, c3; one of
    them had started a once tool) were never read again, and the next command's commit moved
    the offsets past them. (Only with a stream of the partition's own: the instance's refuses
    the claim, which then carries no offsets.)"""
    kafka = MemoryKafka()
    put(kafka, *(command(i) for i in range(4)))
    kafka.committed[COMMANDS_0] = (2, OLD)
    kafka.committed[CONTROL_0] = (0, OLD)
    kafka.offsets_left_out = 1
    async with Instance(kafka, tmp_path, partition_streams=partition_streams) as instance:
        instance.input.positions[COMMANDS_0] = 4  # what the failed owner fetched
        owner, task = instance.owner()
        await until(lambda: task.done() or owner.restored, "the owner to fail or serve")
        if task.done():
            assert task.result() is OwnerExit.FAILED
            owner, task = instance.owner()  # as the runtime re-creates it
            await until(lambda: owner.restored, "the owner to serve")
        put(kafka, command(4))
        await until(lambda: committed(kafka) == 5, "every command committed")
        assert await instance.stop(owner, task) is OwnerExit.STOPPED
    assert answered(kafka) == Counter({"c2": 1, "c3": 1, "c4": 1})


async def old_owner(kafka: MemoryKafka) -> None:
    """The partition's previous owner: it answered c0 and c1 and committed their offsets, then
    died with a transaction open (c2's answer, offsets to 3) and a batch of events whose
    transaction marker was lost (open on a partition, in no transaction)."""
    producer = kafka.producer(OLD)
    await producer.start()
    for offset, records in ((2, [b"c0", b"c1"]), (3, [b"c2"])):
        await producer.begin()
        results = [
            OutRecord(TOPICS.results, b"s", orjson.dumps({"command_id": c.decode()}), partition=0)
            for c in records
        ]
        await producer.send(TOPICS.results, 0, results)
        await producer.commit_offsets(
            GROUP, kafka.membership(), {COMMANDS_0: OffsetAndMetadata(offset, OLD)}
        )
        if offset == 2:
            await producer.commit()
    stray = OutRecord(TOPICS.events, b"s0", b"stray", partition=0)
    kafka.logs[(TOPICS.events, 0)].append(Entry(stray, OLD))


async def test_a_takeover_fences_the_writer_the_offsets_name_and_ends_what_it_left_open(
    tmp_path: Path,
) -> None:
    kafka = MemoryKafka()
    put(kafka, *(command(i) for i in range(5)))
    await old_owner(kafka)
    async with Instance(kafka, tmp_path) as instance:
        owner, task = instance.owner()
        await until(lambda: committed(kafka) == 5, "the commands after the stable offsets")
        assert await instance.stop(owner, task) is OwnerExit.STOPPED
    assert kafka.epochs[OLD] == 2  # fenced while its transaction was open, then to abort as it
    assert answered(kafka) == Counter({f"c{i}": 1 for i in range(5)})  # c2's open answer aborted
    assert b"stray" not in kafka.visible(TOPICS.events)
    assert kafka.open_entries() == 0
    fenced = kafka.calls.index((OLD, "start"), 1)
    assert fenced < first(kafka, "input", "input.seek")
    # Released (fenced, then an abort with the group's offsets), then the repair's abort.
    aborts = [i for i, call in enumerate(kafka.calls) if call == (OLD, "abort")]
    assert first(kafka, OLD, "add_group") < aborts[0] < first(kafka, "input", "input.seek")
    # What was left open is read and the partition restored up to it, then it is aborted and
    # the partition restored past it.
    restores = [i for i, call in enumerate(kafka.calls) if call == ("sessions", "sessions.restore")]
    assert first(kafka, "sessions", "sessions.read_open") < restores[0] < aborts[-1] < restores[1]


async def test_a_transaction_that_ends_within_the_settle_time_is_waited_for_not_fenced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(partition_owner, "SETTLE_S", 5.0)
    kafka = MemoryKafka()
    put(kafka, *(command(i) for i in range(5)))
    await old_owner(kafka)
    kafka.logs[(TOPICS.events, 0)].clear()  # no batch left open outside the transaction
    async with Instance(kafka, tmp_path) as instance:
        owner, task = instance.owner()
        await until(lambda: kafka.calls.count(("group", "fetch")) >= 3, "the wait for stability")
        assert committed(kafka) == 2
        kafka.end(OLD, 0, committed=True)  # the live previous owner's commit lands
        await until(lambda: committed(kafka) == 5, "the commands after c2")
        assert await instance.stop(owner, task) is OwnerExit.STOPPED
    assert kafka.epochs[OLD] == 0  # never fenced
    # c2 was answered by the previous owner's transaction: the new owner starts after it.
    assert answered(kafka) == Counter({f"c{i}": 1 for i in range(5)})
    assert (OLD, "start") not in kafka.calls[1:]


async def test_offsets_unstable_past_the_transaction_timeout_fail_the_owner(
    tmp_path: Path,
) -> None:
    """A transaction the offsets do not name (no offsets committed yet) holds them: nobody to
    fence, so the owner waits out the transaction timeout and fails, having run nothing."""
    kafka = MemoryKafka()
    put(kafka, command(0))
    holder = kafka.producer(f"{GROUP}-unnamed")
    await holder.start()
    await holder.begin()
    offsets = {COMMANDS_0: OffsetAndMetadata(1, "")}
    await holder.commit_offsets(GROUP, kafka.membership(), offsets)
    async with Instance(kafka, tmp_path) as instance:
        runtime = instance.settings.runtime.model_copy(
            update={"transaction_timeout_ms": 100, "commit_timeout_s": 0.1}
        )
        instance.ctx.settings = instance.settings.model_copy(update={"runtime": runtime})
        owner, task = instance.owner()
        async with asyncio.timeout(10):
            assert await task is OwnerExit.FAILED
        assert "stayed unstable" in str(owner.error)
    assert (f"{GROUP}-unnamed", "start") not in kafka.calls[1:]
    assert kafka.committed == {} and answered(kafka) == Counter()
    assert ("input", "input.seek") not in kafka.calls


async def test_records_below_the_start_and_records_fetched_again_are_taken_once(
    tmp_path: Path,
) -> None:
    kafka = MemoryKafka()
    put(kafka, *(command(i) for i in range(5)))
    kafka.committed[COMMANDS_0] = (2, OLD)
    async with Instance(kafka, tmp_path) as instance:
        owner, task = instance.owner()
        await until(
            lambda: committed(kafka) == 5 and instance.inflight.count == 0,
            "the commands after the start, committed and released",
        )
        for offset in (0, 1, 3, 4):  # below the start, then fetched again after a seek
            body = command(offset)
            owner.accept(
                InputRecord(
                    Origin(TOPICS.commands, 0, offset),
                    body["session_id"].encode(),
                    orjson.dumps(body),
                    [],
                    0,
                )
            )
        assert instance.inflight.count == 0
        put(kafka, command(5))
        await until(lambda: committed(kafka) == 6, "the next command")
        assert await instance.stop(owner, task) is OwnerExit.STOPPED
    assert answered(kafka) == Counter({f"c{i}": 1 for i in range(2, 6)})


@pytest.mark.parametrize(
    ("call", "error"),
    [
        ("offsets", GroupFencedError("ILLEGAL_GENERATION")),
        ("commit", ProducerFenced()),
    ],
    ids=["group", "producer"],
)
async def test_a_fenced_owner_exits_fenced_with_nothing_of_its_work_committed(
    tmp_path: Path, call: str, error: Exception
) -> None:
    kafka = MemoryKafka()
    put(kafka, command(0))
    async with Instance(kafka, tmp_path) as instance:
        owner, task = instance.owner()
        await until(lambda: committed(kafka) == 1, "the first command")
        kafka.fail(call, error)
        put(kafka, command(1))
        async with asyncio.timeout(10):
            assert await task is OwnerExit.FENCED
        instance.owners.pop(0)
        assert answered(kafka) == Counter({"c0": 1})
        assert committed(kafka) == 1
        assert instance.inflight.count == 0
        owner, task = instance.owner()  # the group gave the partition back
        await until(lambda: committed(kafka) == 2, "the command again")
        assert await instance.stop(owner, task) is OwnerExit.STOPPED
    assert answered(kafka) == Counter({"c0": 1, "c1": 1})


async def test_a_stop_gives_running_steps_the_grace_period_and_moves_the_offsets(
    tmp_path: Path,
) -> None:
    kafka = MemoryKafka()
    put(kafka, command(0, sessions=3), command(1, sessions=3))
    put(kafka, command(2, agent="gated", sessions=3), command(3, sessions=3))
    async with Instance(kafka, tmp_path) as instance:
        owner, task = instance.owner()
        await until(lambda: answered(kafka)["c3"] == 1 and instance.gated.waiting == 1, "c3")
        owner.request_stop(0.05)
        put(kafka, command(4, sessions=3))  # after the stop request: not started
        async with asyncio.timeout(10):
            assert await task is OwnerExit.STOPPED
        instance.owners.pop(0)
        assert instance.inflight.count == 0
        # c2 was abandoned: the last commit moved the offsets up to it, not past it.
        assert committed(kafka) == 2
        assert answered(kafka) == Counter({"c0": 1, "c1": 1, "c3": 1})
        instance.gated.gate.set()
        owner, task = instance.owner()
        await until(lambda: committed(kafka) == 5, "the rest, by the next owner")
        assert await instance.stop(owner, task) is OwnerExit.STOPPED
    # c3 was answered before: the next owner reads it again and skips it.
    assert answered(kafka) == Counter({f"c{i}": 1 for i in range(5)})


async def test_a_stop_whose_steps_finish_within_the_grace_period_commits_them(
    tmp_path: Path,
) -> None:
    kafka = MemoryKafka()
    put(kafka, command(0, agent="gated"), command(1))
    async with Instance(kafka, tmp_path) as instance:
        owner, task = instance.owner()
        await until(lambda: instance.gated.waiting == 1 and answered(kafka)["c1"] == 1, "c1")
        owner.request_stop(5.0)
        instance.gated.gate.set()
        async with asyncio.timeout(10):
            assert await task is OwnerExit.STOPPED
    assert committed(kafka) == 2
    assert answered(kafka) == Counter({"c0": 1, "c1": 1})


async def test_a_stop_at_a_boundary_starts_nothing_queued_behind_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop comes in the event-loop turn in which c0's first boundary became durable (a
    rebalance's revoke beside a commit's return): c0 is left at that boundary, and r1, queued
    behind it in the same session, must not start. Answered, r1 would be the session's newest
    answered command, so the next owner would take c0, read before it, for a repeat and never
    answer it."""
    owners: list[PartitionOwner] = []
    stopped: list[PartitionOwner] = []
    flush = Committer.flush

    async def stop_once_durable(self: Committer, *, final: bool = False) -> None:
        await flush(self, final=final)
        if owners and not stopped:
            stopped.append(owners[0])
            owners[0].request_stop(5.0)

    monkeypatch.setattr(Committer, "flush", stop_once_durable)
    kafka = MemoryKafka()
    put(kafka, {**command(0, agent="gated-after-tools"), "session_id": "s0"})
    put(kafka, {**command(1, agent="nobody"), "session_id": "s0"})
    async with Instance(kafka, tmp_path / "a") as instance:
        owner, task = instance.owner()
        owners.append(owner)
        async with asyncio.timeout(10):
            assert await task is OwnerExit.STOPPED
        instance.owners.pop(0)
    assert answered(kafka) == Counter()
    assert committed(kafka) <= 0
    monkeypatch.setattr(Committer, "flush", flush)
    async with Instance(kafka, tmp_path / "b") as instance:
        instance.gated_after_tools.gate.set()
        owner, task = instance.owner()
        await until(lambda: answered(kafka)["c1"] == 1, "r1, after c0")
        assert await instance.stop(owner, task) is OwnerExit.STOPPED
    results = [orjson.loads(value) for value in kafka.visible(TOPICS.results) if value]
    assert [(r["command_id"], r["stop_reason"]) for r in results] == [
        ("c0", "end_turn"),
        ("c1", "error"),
    ]


@pytest.mark.parametrize("holder", [OURS, OLD])
async def test_offsets_a_broker_restart_left_pending_are_released_and_the_partition_served(
    tmp_path: Path, holder: str
) -> None:
    """The previous owner's last commit was completed by the coordinator and its markers were
    lost: its offsets stay pending and its batches open, whatever producer starts. The new owner
    releases the offsets as the producer holding them (its own id, as in ``partition`` mode, or
    the one the offsets name), repairs the batches, and answers every command once."""
    kafka = MemoryKafka()
    put(kafka, *(command(i) for i in range(4)))
    kafka.committed[COMMANDS_0] = (2, holder)
    lost = kafka.producer(holder)
    await lost.start()
    await lost.begin()
    await lost.send(TOPICS.results, 0, [OutRecord(TOPICS.results, b"s0", b"stray", partition=0)])
    await lost.commit_offsets(GROUP, kafka.membership(), {COMMANDS_0: OffsetAndMetadata(4, holder)})
    kafka.lose_markers(holder)
    async with Instance(kafka, tmp_path) as instance:
        owner, task = instance.owner()
        await until(lambda: committed(kafka) == 4, "the commands after the released offsets")
        assert await instance.stop(owner, task) is OwnerExit.STOPPED
    assert answered(kafka) == Counter({"c2": 1, "c3": 1})
    assert b"stray" not in kafka.visible(TOPICS.results)
    assert kafka.pending == {}
    assert (holder, "add_group") in kafka.calls


async def test_a_failed_read_of_a_fork_source_answers_the_fork_and_the_partition_goes_on(
    tmp_path: Path,
) -> None:
    kafka = MemoryKafka()
    fork = {
        "type": "fork",
        "schema_version": 1,
        "command_id": "f0",
        "session_id": "copy",
        "source_session_id": "s0",
        "version": 1,
    }
    put(kafka, command(0), fork, command(1))
    kafka.fail("sessions.session_records", KafkaConnectionError("source read failed"))
    async with Instance(kafka, tmp_path) as instance:
        owner, task = instance.owner()
        await until(lambda: committed(kafka) == 3, "every command committed")
        assert await instance.stop(owner, task) is OwnerExit.STOPPED
    assert answered(kafka) == Counter({"c0": 1, "f0": 1, "c1": 1})
    results = {
        r["command_id"]: r
        for r in (orjson.loads(v) for v in kafka.visible(TOPICS.results) if v is not None)
    }
    assert results["f0"]["stop_reason"] == "error"
    assert results["f0"]["error"]["code"] == "internal"
    assert "source read failed" in results["f0"]["error"]["message"]


OWNER_CALLS = (
    "fetch",
    "start",
    "begin",
    "partition_of",
    "send",
    "delivery",
    "add_group",
    "offsets",
    "commit",
    "abort",
    "input.seek",
    "input.beginning_offsets",
    "sessions.partition_count",
    "sessions.stable_and_end",
    "sessions.read_open",
    "sessions.topic_id",
    "sessions.restore",
)
"""Every call an owner makes of Kafka, itself or through its stream's transactions."""
LOOP_CALLS = {"input.fetch", "input.assignment", "input.paused", "input.pause", "input.resume"}


async def takeover(kafka: MemoryKafka, root: Path, fail_at: tuple[str, int] | None) -> Any:
    """The takeover scenario with a failure at the ``n``-th call of ``call`` (counted from the
    new owner's start); returns the calls the first owner made, its exit, and whether the
    failure fired before its stop was requested."""
    put(kafka, *(command(i) for i in range(6)))
    await old_owner(kafka)
    async with Instance(kafka, root) as instance:
        start = len(kafka.calls)
        if fail_at is not None:
            call, nth = fail_at
            kafka.fail(call, KafkaConnectionError(f"{call} #{nth} failed"), after=nth)
        owner, task = instance.owner()
        await until(lambda: task.done() or committed(kafka) == 6, "the owner's end or its work")
        stop_at = len(kafka.calls)
        exit_ = await instance.stop(owner, task)
        calls = [c for _, c in kafka.calls[start:] if c not in LOOP_CALLS]
        fired = [position for position, _ in kafka.fired]
        # Never a commit of work not done: every command below the committed offset is answered
        # (once), and nothing is answered twice.
        done = answered(kafka)
        assert all(count == 1 for count in done.values()), done
        assert {f"c{i}" for i in range(committed(kafka))} <= set(done)
        if fired:
            # A re-created owner: every command answered, exactly once.
            owner, task = instance.owner()
            await until(lambda: committed(kafka) == 6, "the re-created owner's work")
            assert await instance.stop(owner, task) is OwnerExit.STOPPED
            assert answered(kafka) == Counter({f"c{i}": 1 for i in range(6)})
            assert b"stray" not in kafka.visible(TOPICS.events)
    return calls, exit_, bool(fired) and fired[0] < stop_at, bool(fired)


BASELINE: list[str] = []
"""The calls of the first owner in the takeover scenario without a failure (run once)."""


@pytest.mark.parametrize("call", OWNER_CALLS)
async def test_a_failure_at_any_call_of_the_owner_fails_it_and_loses_nothing(
    tmp_path: Path, call: str
) -> None:
    if not BASELINE:
        calls, exit_, _, _ = await takeover(MemoryKafka(), tmp_path / "baseline", None)
        assert exit_ is OwnerExit.STOPPED
        BASELINE.extend(calls)
    calls = BASELINE
    assert set(calls) <= set(OWNER_CALLS), "a call of the owner's is not tested here"
    occurrences = calls.count(call)
    assert occurrences, f"the owner never calls {call}"
    fired = 0
    for nth in range(occurrences):
        _, exit_, before_stop, did_fire = await takeover(
            MemoryKafka(), tmp_path / f"{call}-{nth}", (call, nth)
        )
        if not did_fire:
            # Later commits may join in fewer transactions than in the baseline run.
            assert nth > 0, f"the first {call} was not reached"
            continue
        fired += 1
        # A failure while stopping cuts the last commit short: the owner still stops.
        assert exit_ is (OwnerExit.FAILED if before_stop else OwnerExit.STOPPED), (nth, exit_)
    assert fired


def delete_command(index: int, session: str) -> dict[str, Any]:
    return {"type": "delete", "command_id": f"c{index}", "session_id": session}


def history_command(index: int, session: str) -> dict[str, Any]:
    return {"type": "history", "command_id": f"c{index}", "session_id": session}


@pytest.mark.parametrize(
    "unremembered",
    [delete_command(1, "s1"), history_command(1, "nobody")],
    ids=["a-delete", "a-history-of-a-session-without-state"],
)
async def test_what_no_state_remembers_is_answered_only_with_the_offsets_moved_past_it(
    tmp_path: Path, unremembered: dict[str, Any]
) -> None:
    """Nothing but the committed offsets recognises it read again (a delete removes the state, a
    read makes none): answered while an earlier record of its partition still ran, the offsets
    could not move past it, and a later owner would read it again and answer it again (for a
    delete, deleting what its session did since)."""
    kafka = MemoryKafka()
    put(kafka, command(0, agent="gated", sessions=3), unremembered)
    async with Instance(kafka, tmp_path) as instance:
        owner, task = instance.owner()
        await until(lambda: instance.gated.waiting == 1, "c0 running")
        put(kafka, command(2, sessions=3))  # another session goes on meanwhile
        await until(lambda: answered(kafka)["c2"] == 1, "c2")
        assert answered(kafka)["c1"] == 0, "it waits for c0"
        instance.gated.gate.set()
        await until(lambda: answered(kafka)["c1"] == 1, "it")
        assert committed(kafka) >= 2, "its commit moved the offsets past it"
        assert await instance.stop(owner, task) is OwnerExit.STOPPED
    assert answered(kafka) == Counter({"c0": 1, "c1": 1, "c2": 1})


@pytest.mark.parametrize("topic", [TOPICS.commands, TOPICS.control])
async def test_a_record_of_another_partitions_session_is_answered_with_the_offsets_past_it(
    tmp_path: Path, topic: str
) -> None:
    """A command or cancel whose key belongs on another partition is refused without its
    session's state (its owner holds it), so only the committed offsets recognise it read again:
    answered while an earlier record of its partition still ran, a later owner would answer it
    a second time. (On the control topic the earlier record is a cancel of the running c0.)"""
    kafka = MemoryKafka()
    # With two partitions "s0" and "other" belong on partition 0, "elsewhere" on partition 1.
    put(kafka, {**command(0, agent="gated"), "session_id": "s0"})
    foreign: dict[str, Any] = {**command(1), "session_id": "elsewhere"}
    home, expected = COMMANDS_0, Counter({"c0": 1, "c1": 1, "c2": 1})
    async with Instance(kafka, tmp_path) as instance:
        instance.ctx.partitions = 2
        owner, task = instance.owner()
        await until(lambda: instance.gated.waiting == 1, "c0 running")
        if topic == TOPICS.control:
            cancel = {"type": "cancel", "command_id": "k0", "session_id": "s0"}
            kafka.append(topic, 0, b"s0", orjson.dumps({**cancel, "after_current_tools": True}))
            foreign = {**cancel, "command_id": "c1", "session_id": "elsewhere"}
            home, expected = CONTROL_0, expected + Counter({"k0": 1})
        at = kafka.append(topic, 0, b"elsewhere", orjson.dumps(foreign))
        put(kafka, {**command(2), "session_id": "other"})  # another session goes on meanwhile
        await until(lambda: answered(kafka)["c2"] == 1, "c2")
        assert answered(kafka)["c1"] == 0, "it waits for the record before it"
        instance.gated.gate.set()
        await until(lambda: answered(kafka)["c1"] == 1, "it")
        assert committed(kafka, home) > at, "its commit moved the offsets past it"
        assert await instance.stop(owner, task) is OwnerExit.STOPPED
    assert answered(kafka) == expected
    [refusal] = [
        body
        for value in kafka.visible(TOPICS.results)
        if value is not None and (body := orjson.loads(value))["command_id"] == "c1"
    ]
    assert refusal["error"]["code"] == "invalid_command"
    assert "belongs on partition 1" in refusal["error"]["message"]


def dead_letters(kafka: MemoryKafka) -> list[bytes | None]:
    return kafka.visible(TOPICS.dlq)


@pytest.mark.parametrize("topic", [TOPICS.commands, TOPICS.control])
@pytest.mark.parametrize("stopped", [False, True], ids=["earlier-finished", "stopped-meanwhile"])
async def test_a_dead_letter_is_committed_with_the_offsets_past_its_record_and_written_once(
    tmp_path: Path, topic: str, stopped: bool
) -> None:
    """A record that names no session is dead-lettered, and nothing but the committed offsets
    recognises it read again: it waits until every earlier record of its partition is finished
    and commits with the offsets past it. An owner that stops first leaves it to the next one,
    which writes it (once). (On the control topic the earlier record is a cancel of the running
    c0.)"""
    kafka = MemoryKafka()
    put(kafka, {**command(0, agent="gated"), "session_id": "s0"})
    home = COMMANDS_0 if topic == TOPICS.commands else CONTROL_0
    expected = Counter({"c0": 1, "c2": 1})
    async with Instance(kafka, tmp_path / "a") as instance:
        owner, task = instance.owner()
        await until(lambda: instance.gated.waiting == 1, "c0 running")
        if topic == TOPICS.control:
            cancel = {"type": "cancel", "command_id": "k0", "session_id": "s0"}
            kafka.append(topic, 0, b"s0", orjson.dumps({**cancel, "after_current_tools": True}))
            expected += Counter({"k0": 1})
        at = kafka.append(topic, 0, b"s1", b"not json")
        put(kafka, {**command(2), "session_id": "s1"})  # another session goes on meanwhile
        await until(lambda: answered(kafka)["c2"] == 1, "c2")
        assert dead_letters(kafka) == [], "it waits for the record before it"
        if stopped:
            assert await instance.stop(owner, task, grace_s=0.05) is OwnerExit.STOPPED
            assert instance.inflight.count == 0
            assert dead_letters(kafka) == [], "left to the next owner"
            assert committed(kafka, home) <= at
        else:
            instance.gated.gate.set()
            await until(lambda: len(dead_letters(kafka)) == 1, "its dead letter")
            assert committed(kafka, home) > at, "its commit moved the offsets past it"
            assert await instance.stop(owner, task) is OwnerExit.STOPPED
    async with Instance(kafka, tmp_path / "b") as instance:
        instance.gated.gate.set()
        owner, task = instance.owner()
        await until(lambda: committed(kafka, home) > at, "the offsets past it")
        assert await instance.stop(owner, task) is OwnerExit.STOPPED
    assert dead_letters(kafka) == [b"not json"]
    assert answered(kafka) == expected


@pytest.mark.parametrize("targeted", [False, True], ids=["untargeted", "targeted"])
@pytest.mark.parametrize("read", [True, False], ids=["read-late", "never-read"])
async def test_a_command_left_mid_turn_is_answered_before_the_cancel_read_ahead_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, targeted: bool, read: bool
) -> None:
    """An owner stops while c0 waits past its first tool cycle (its in-flight marker
    committed), and a cancel of it is published. The next owner reads the cancel before c0's
    record (its commands partition answered late): the cancel waits for c0 to be read, so c0's
    ``cancelled`` result comes first and the cancel's names it ``stopped``, as when both are
    read together; c1, the session's previous command, read again between them (c9 of another
    session held the committed offsets back) and recognised as answered, lets nothing go
    before c0. Past the wait the cancel is answered first, and c0 after it."""
    monkeypatch.setattr(cancels, "LEFT_COMMAND_WAIT_S", 10.0 if read else 0.2)
    kafka = MemoryKafka()
    put(kafka, {**command(9, agent="gated"), "session_id": "s1"})
    put(kafka, {**command(1), "session_id": "s0"})
    put(kafka, {**command(0, agent="gated-after-tools"), "session_id": "s0"})
    async with Instance(kafka, tmp_path / "a") as instance:
        owner, task = instance.owner()
        await until(lambda: instance.gated_after_tools.waiting == 1, "c0 past its tools")
        assert await instance.stop(owner, task, grace_s=0.05) is OwnerExit.STOPPED
    assert answered(kafka) == Counter({"c1": 1})
    assert committed(kafka) == 0
    cancel = {"type": "cancel", "command_id": "k0", "session_id": "s0"}
    if targeted:
        cancel["target_command_id"] = "c0"
    # The in-memory log dates a record by its offset: the cancel is published after c0.
    for pad in ("p0", "p1"):
        pad_cancel = {"type": "cancel", "command_id": pad, "session_id": "s2"}
        kafka.append(TOPICS.control, 0, b"s2", orjson.dumps(pad_cancel))
    kafka.append(TOPICS.control, 0, b"s0", orjson.dumps(cancel))
    async with Instance(kafka, tmp_path / "b") as instance:
        instance.input.withheld.add(COMMANDS_0)
        owner, task = instance.owner()

        def waiting() -> int:
            parts = owner._parts
            return parts.cancels.awaiting if parts is not None else 0

        if read:
            await until(lambda: waiting() == 1, "the wait")
            assert answered(kafka)["k0"] == 0, "not answered before c0"
        else:
            await until(lambda: answered(kafka)["k0"] == 1, "the cancel, past the wait")
        instance.input.withheld.clear()
        await until(lambda: answered(kafka)["c0"] == 1 and answered(kafka)["k0"] == 1, "both")
        assert await instance.stop(owner, task) is OwnerExit.STOPPED
    results = [
        body
        for value in kafka.visible(TOPICS.results)
        if value is not None and (body := orjson.loads(value))["session_id"] == "s0"
    ]
    assert [(r["command_id"], r["stop_reason"]) for r in results] == [("c1", "end_turn")] + (
        [("c0", "cancelled"), ("k0", "cancelled")]
        if read
        else [("k0", "cancelled"), ("c0", "cancelled")]
    )
    assert results[[r["command_id"] for r in results].index("k0")]["cancel"]["stopped"] == (
        "c0" if read or not targeted else None
    )


async def test_a_cancel_or_delete_reusing_the_id_of_a_command_not_answered_is_a_repeat(
    tmp_path: Path,
) -> None:
    """c0 runs (its model waits) and c1 waits behind it when two cancels, reusing the ids c0
    and c1, and a delete reusing c1 are read: each is a repeat of the command whose id it
    carries, as of one the session answered. c0 is not stopped, c1 runs, and none of the
    three acts unanswered or gets a second result under that id."""
    kafka = MemoryKafka()
    put(kafka, {**command(0, agent="gated"), "session_id": "s0"})
    async with Instance(kafka, tmp_path / "a") as instance:
        owner, task = instance.owner()
        await until(lambda: instance.gated.waiting == 1, "c0 running")
        put(kafka, {**command(1), "session_id": "s0"})
        await until(lambda: instance.inflight.count == 2, "c1 read")
        for reused in ("c0", "c1"):
            cancel = {"type": "cancel", "command_id": reused, "session_id": "s0"}
            kafka.append(TOPICS.control, 0, b"s0", orjson.dumps(cancel))
        put(kafka, {"type": "delete", "command_id": "c1", "session_id": "s0"})
        await until(lambda: instance.inflight.count == 5, "the cancels and the delete read")
        instance.gated.gate.set()
        await until(
            lambda: committed(kafka) == 3 and committed(kafka, CONTROL_0) == 2, "all passed"
        )
        assert await instance.stop(owner, task) is OwnerExit.STOPPED
    results = [orjson.loads(value) for value in kafka.visible(TOPICS.results) if value]
    assert [(r["command_id"], r["stop_reason"]) for r in results] == [
        ("c0", "end_turn"),
        ("c1", "end_turn"),
    ]


@pytest.mark.parametrize("topic_id", [None, "T1"], ids=["no-topic-ids", "topic-id"])
async def test_a_session_answering_more_than_the_ids_it_keeps_runs_none_again_on_a_takeover(
    tmp_path: Path, topic_id: str | None
) -> None:
    """The committed offset stays at the oldest unfinished record: a session that answered
    more commands than it keeps ids of meanwhile (another session's step running all along)
    has all of them read again by the next owner, which must still run none of them twice:
    by their offsets in the log their topic id names, or by their publication times when the
    broker gives no ids."""
    kafka = MemoryKafka()
    if topic_id is not None:
        kafka.topic_ids[TOPICS.commands] = topic_id
    put(kafka, command(0, agent="gated", sessions=1))
    busy = [{**command(i), "session_id": "busy"} for i in range(1, APPLIED_KEPT + 21)]
    put(kafka, *busy)
    async with Instance(kafka, tmp_path) as instance:
        owner, task = instance.owner()
        await until(lambda: answered(kafka)[busy[-1]["command_id"]] == 1, "the busy session")
        owner.request_stop(0.05)
        async with asyncio.timeout(10):
            assert await task is OwnerExit.STOPPED
        instance.owners.pop(0)
        assert committed(kafka) == 0, "c0 was left running: nothing after it is committed"
        instance.gated.gate.set()
        owner, task = instance.owner()
        await until(lambda: committed(kafka) == len(busy) + 1, "everything, by the next owner")
        assert instance.ctx.cache.total > 0
        assert await instance.stop(owner, task) is OwnerExit.STOPPED
        assert instance.ctx.cache.total == 0, "an owner that ended leaves no session in memory"
    assert answered(kafka) == Counter({f"c{i}": 1 for i in range(len(busy) + 1)})


@pytest.mark.parametrize(
    ("ids", "runs"),
    [(("T1", "T2"), True), (("T1", "T1"), False), ((None, None), False)],
    ids=["new-topic-id", "same-topic-id", "no-topic-ids"],
)
async def test_a_command_of_a_commands_topic_created_anew_runs_whatever_its_time_and_offset(
    tmp_path: Path, ids: tuple[str | None, str | None], runs: bool
) -> None:
    """The commands topic deleted and created again: its offsets start again at 0, and a
    producer that sets its records' timestamps (a replay keeping CreateTime) publishes a
    command with an older time than the newest one its session answered on the old topic.
    The topic's new id tells the logs apart, and the command runs. Without ids (a broker older
    than Kafka 3.1) only the time can tell, and such a command is taken for answered; within
    one log a record at or before the newest answered was answered."""
    kafka = MemoryKafka()
    old, new = ids
    if old is not None:
        kafka.topic_ids[TOPICS.commands] = old
    put(kafka, *(command(i, sessions=1) for i in range(4)))
    async with Instance(kafka, tmp_path) as instance:
        owner, task = instance.owner()
        await until(lambda: committed(kafka) == 4, "the old topic's commands")
        assert await instance.stop(owner, task) is OwnerExit.STOPPED
        # Deleted and created again: its records and the group's offsets of it are gone.
        kafka.logs[(TOPICS.commands, 0)].clear()
        del kafka.committed[COMMANDS_0]
        instance.input.positions[COMMANDS_0] = 0
        if new is not None:
            kafka.topic_ids[TOPICS.commands] = new
        put(kafka, command(9, sessions=1))  # offset 0, published at 0 (MemoryInput's times)
        owner, task = instance.owner()
        await until(lambda: committed(kafka) == 1, "the new topic's command read")
        assert await instance.stop(owner, task) is OwnerExit.STOPPED
    expected = Counter({f"c{i}": 1 for i in range(4)})
    if runs:
        expected["c9"] = 1
    assert answered(kafka) == expected


def _expiry_rounds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A counter (its one item) of the idle expiry's rounds, each of which lists idle sessions
    (from the oldest first: its later batches go on after a session)."""
    rounds = [0]
    idle = SessionStore.idle

    def counted(
        store: SessionStore, before_ms: int, limit: int, after: tuple[str, int] | None = None
    ) -> list[tuple[str, int]]:
        rounds[0] += after is None
        return idle(store, before_ms, limit, after)

    monkeypatch.setattr(SessionStore, "idle", counted)
    return rounds


async def test_an_idle_session_expires_only_once_no_record_of_it_can_be_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Expiry takes the session's command ids with it: while another session's step holds the
    committed offset below its command, that command would run again after a takeover."""
    rounds = _expiry_rounds(monkeypatch)
    monkeypatch.setattr(idle_expiry, "_BATCH", 10)
    kafka = MemoryKafka()
    put(kafka, command(0, agent="gated"), command(1))  # s0 runs on; s1 answers and goes idle
    async with Instance(kafka, tmp_path) as instance:
        sessions = instance.settings.sessions.model_copy(update={"idle_ttl_s": 0.01})
        instance.ctx.settings = instance.settings.model_copy(update={"sessions": sessions})
        owner, task = instance.owner()
        await until(lambda: answered(kafka)["c1"] == 1, "c1")
        await until(lambda: rounds[0] >= 3, "three rounds of the expiry while c0 runs")
        assert not expired(kafka), "s1 expired while c0 held the offsets below c1"
        owner.request_stop(0.05)  # c0 is left running: nothing after it is committed
        async with asyncio.timeout(10):
            assert await task is OwnerExit.STOPPED
        instance.owners.pop(0)
        instance.gated.gate.set()
        owner, task = instance.owner()
        await until(lambda: answered(kafka)["c0"] == 1, "c0, by the next owner")
        await until(lambda: expired(kafka) == ["s0", "s1"], "both sessions, once idle")
        assert await instance.stop(owner, task) is OwnerExit.STOPPED
    assert answered(kafka) == Counter({"c0": 1, "c1": 1})


async def test_a_targeted_cancel_read_after_its_sessions_expiry_leaves_an_answered_target_alone(
    tmp_path: Path,
) -> None:
    kafka = MemoryKafka()
    put(kafka, command(1))
    async with Instance(kafka, tmp_path) as instance:
        sessions = instance.settings.sessions.model_copy(update={"idle_ttl_s": 0.01})
        instance.ctx.settings = instance.settings.model_copy(update={"sessions": sessions})
        owner, task = instance.owner()
        await until(lambda: expired(kafka) == ["s1"], "s1 answered c1 and expired")
        cancel = {"type": "cancel", "command_id": "k1", "session_id": "s1"}
        kafka.append(TOPICS.control, 0, b"s1", orjson.dumps({**cancel, "target_command_id": "c1"}))
        await until(lambda: answered(kafka)["k1"] == 1, "the cancel")
        assert await instance.stop(owner, task) is OwnerExit.STOPPED
    assert answered(kafka) == Counter({"c1": 1, "k1": 1}), "c1 was answered a second time"


async def test_a_session_grows_no_idler_while_no_fetch_is_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker away past the idle ttl: a command a client published for the session meanwhile
    (held in its producer until the broker is back) still finds the session, not a fresh one."""
    rounds = _expiry_rounds(monkeypatch)
    kafka = MemoryKafka()
    put(kafka, command(1))
    async with Instance(kafka, tmp_path) as instance:
        sessions = instance.settings.sessions.model_copy(update={"idle_ttl_s": 2.0})
        instance.ctx.settings = instance.settings.model_copy(update={"sessions": sessions})
        stamped = instance.input.fetched_at
        asked = 0

        def fetched_at(tp: TopicPartition) -> int | None:
            nonlocal asked
            asked += 1
            return stamped(tp)

        monkeypatch.setattr(instance.input, "fetched_at", fetched_at)
        owner, task = instance.owner()
        await until(lambda: answered(kafka)["c1"] == 1, "c1")
        away = kafka.hang("input.fetch")  # the broker goes away: no fetch is answered
        try:
            # Six rounds of the expiry (3 s, past the 2 s ttl), counted however a round begins.
            await until(lambda: rounds[0] >= 6 or asked >= 12, "six rounds of the expiry", 30)
            expired_meanwhile = expired(kafka)
            put(kafka, {**command(3), "session_id": "s1"})  # published while the broker was away
        finally:
            away.set()  # the broker is back (and the instance can stop)
        assert not expired_meanwhile, "s1 expired while no fetch was answered"
        await until(lambda: answered(kafka)["c3"] == 1, "c3")
        assert await instance.stop(owner, task) is OwnerExit.STOPPED
    versions = {
        body["command_id"]: body["version"]
        for value in kafka.visible(TOPICS.results)
        if value is not None and (body := orjson.loads(value))
    }
    assert versions["c3"] > versions["c1"], "c3 ran on a fresh session"


async def test_every_owner_of_an_instance_shares_what_it_saw_of_outages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An owner made after the broker came back learns of the outage its predecessors saw."""
    given: list[object] = []

    async def recorded(*args: Any, outages: object = None, **kwargs: Any) -> None:
        given.append(outages)

    monkeypatch.setattr(partition_owner, "expire_idle", recorded)
    kafka = MemoryKafka()
    async with Instance(kafka, tmp_path) as instance:
        sessions = instance.settings.sessions.model_copy(update={"idle_ttl_s": 2.0})
        instance.ctx.settings = instance.settings.model_copy(update={"sessions": sessions})
        for made in (1, 2):
            owner, task = instance.owner()
            await until(lambda made=made: len(given) == made, "its idle expiry started")
            assert await instance.stop(owner, task) is OwnerExit.STOPPED
    assert len(given) == 2 and all(seen is instance.ctx.outages for seen in given)


def expired(kafka: MemoryKafka) -> list[str]:
    return sorted(
        body["session_id"]
        for value in kafka.visible(TOPICS.events)
        if value is not None and (body := orjson.loads(value))["type"] == "session_expired"
    )


def test_every_call_of_the_owner_failed_in_a_test_above(request: pytest.FixtureRequest) -> None:
    assert_every_call_failed(
        request,
        Transport,
        TxnProducer,
        GroupOffsets,
        Sessions,
        InputSource,
        elsewhere={
            **{f"InputSource.{c.removeprefix('input.')}": "the loop's" for c in LOOP_CALLS},
            "Sessions.partition_for": "test_owner_left_open.py",
            "Sessions.committed_tail": "test_owner_left_open.py",
        },
    )
