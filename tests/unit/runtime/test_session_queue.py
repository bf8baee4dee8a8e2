"""Per-session serial queues: order within a session, concurrency across sessions, close."""

from __future__ import annotations

import asyncio

import pytest

from service.runtime.session_queue import SessionQueues
from service.runtime.work import CommandWork, InputRecord, Origin
from service.wire.errors import WireError


def _work(session: str, offset: int) -> CommandWork:
    record = InputRecord(Origin("c", 0, offset), session.encode(), b"", [], 0)
    return CommandWork(record, session, None)


async def test_one_session_runs_in_order_while_others_run_concurrently() -> None:
    running: set[str] = set()
    overlap: list[tuple[str, str]] = []
    done: list[tuple[str, int]] = []
    gate = asyncio.Event()

    async def handle(work: CommandWork) -> None:
        assert work.session_id not in running
        for other in running:
            overlap.append((work.session_id, other))
        running.add(work.session_id)
        await gate.wait()
        running.discard(work.session_id)
        done.append((work.session_id, work.record.origin.offset))

    async with asyncio.TaskGroup() as tasks:
        queues = SessionQueues(tasks, handle)
        for offset, session in enumerate(["a", "b", "a", "b", "a"]):
            queues.put(_work(session, offset))
        await asyncio.sleep(0)
        assert queues.sessions == 2
        gate.set()
        await asyncio.wait_for(queues.wait_idle(), 5)
    assert [o for s, o in done if s == "a"] == [0, 2, 4]
    assert [o for s, o in done if s == "b"] == [1, 3]
    assert overlap  # a and b ran at the same time


async def test_close_starts_nothing_new() -> None:
    started: list[int] = []
    release = asyncio.Event()

    async def handle(work: CommandWork) -> None:
        started.append(work.record.origin.offset)
        await release.wait()

    async with asyncio.TaskGroup() as tasks:
        queues = SessionQueues(tasks, handle)
        queues.put(_work("a", 0))
        queues.put(_work("a", 1))
        await asyncio.sleep(0)
        queues.close()
        queues.put(_work("b", 2))
        release.set()
        await asyncio.wait_for(queues.wait_idle(), 5)
    assert started == [0]


async def test_a_stray_cancelled_error_does_not_drop_the_next_command() -> None:
    handled: list[int] = []

    async def handle(work: CommandWork) -> None:
        handled.append(work.record.origin.offset)
        if work.record.origin.offset == 0:
            raise asyncio.CancelledError  # leaked by a library, not a cancel of this worker

    async with asyncio.TaskGroup() as tasks:
        queues = SessionQueues(tasks, handle)
        queues.put(_work("a", 0))
        queues.put(_work("a", 1))
        await asyncio.wait_for(queues.wait_idle(), 5)
    assert handled == [0, 1]
    assert queues.sessions == 0


async def test_a_cancel_of_the_worker_still_stops_the_queue() -> None:
    started: list[int] = []
    running = asyncio.Event()

    async def handle(work: CommandWork) -> None:
        started.append(work.record.origin.offset)
        running.set()
        await asyncio.Event().wait()

    class Stop(Exception):
        pass

    with pytest.raises(ExceptionGroup) as caught:
        async with asyncio.TaskGroup() as tasks:
            queues = SessionQueues(tasks, handle)
            queues.put(_work("a", 0))
            queues.put(_work("a", 1))
            await asyncio.wait_for(running.wait(), 5)
            raise Stop  # the group cancels its workers
    assert caught.group_contains(Stop)
    assert started == [0], "the worker was cancelled: nothing queued behind it starts"
    assert queues.sessions == 0


async def test_a_record_put_while_the_task_group_ends_is_left_for_the_next_owner() -> None:
    handled: list[int] = []

    async def handler(work: CommandWork) -> None:
        handled.append(work.record.origin.offset)

    async def fail() -> None:
        raise ValueError("the owner fails")

    queues: SessionQueues | None = None
    put = False
    with pytest.raises(ExceptionGroup) as failed:
        async with asyncio.TaskGroup() as tasks:
            queues = SessionQueues(tasks, handler)
            tasks.create_task(fail())
            try:
                await asyncio.sleep(1)
            except asyncio.CancelledError:
                # The group is shutting down now; a record routed meanwhile starts nothing.
                queues.put(_work("s", 1))
                queues.put(_work("t", 2))
                put = True
                raise
    assert put and [type(e) for e in failed.value.exceptions] == [ValueError]
    assert queues is not None and handled == []
    await asyncio.wait_for(queues.wait_idle(), 1)


async def test_reads_are_kept_only_until_the_input_offsets_pass_them() -> None:
    # A session never expired (deleted, or with no state) must not be remembered for the
    # owner's life: what is kept is bounded by what was read since the offsets last moved.
    gate = asyncio.Event()

    async def handle(work: CommandWork) -> None:
        if work.session_id == "busy":
            await gate.wait()

    committed = 0

    def passed(topic: str, offset: int) -> bool:
        return offset < committed

    async with asyncio.TaskGroup() as tasks:
        queues = SessionQueues(tasks, handle, track_reads=True)
        for offset, session in enumerate(["gone", "busy", "late", "gone"]):
            queues.put(_work(session, offset))
        for _ in range(3):
            await asyncio.sleep(0)
        committed = 3
        queues.forget_passed(passed)
        # "gone" read at 3, not passed yet; "busy" still queued; "late" passed.
        assert [s for s in ("gone", "busy", "late") if queues.reads(s)] == ["gone", "busy"]
        committed = 10
        queues.forget_passed(passed)
        assert queues.reads("gone") == {} and queues.reads("busy") == {"c": 1}
        gate.set()
        await asyncio.wait_for(queues.wait_idle(), 5)
        queues.forget_passed(passed)
        assert queues.reads("busy") == {}


async def test_forgetting_reads_looks_no_further_than_the_first_read_not_passed() -> None:
    async def handle(work: CommandWork) -> None:
        pass

    asked: list[int] = []

    def passed(topic: str, offset: int) -> bool:
        asked.append(offset)
        return offset < 10

    async with asyncio.TaskGroup() as tasks:
        queues = SessionQueues(tasks, handle, track_reads=True)
        for offset in range(1_000):
            queues.put(_work(f"s{offset}", offset))
        # Read again: the newest read of s0 is now the latest of all.
        queues.put(_work("s0", 1_000))
        await asyncio.wait_for(queues.wait_idle(), 5)
        queues.forget_passed(passed)
    assert asked == list(range(1, 11))
    assert not queues.reads("s9") and queues.reads("s10") == {"c": 10}
    assert queues.reads("s0") == {"c": 1_000}


async def test_holds_names_the_commands_handled_and_queued_until_they_are_done() -> None:
    gate = asyncio.Event()

    async def handle(_: CommandWork) -> None:
        await gate.wait()

    def work(session: str, offset: int, command_id: str) -> CommandWork:
        made = _work(session, offset)
        made.error = WireError("refused", session_id=session, command_id=command_id)
        return made

    async with asyncio.TaskGroup() as tasks:
        queues = SessionQueues(tasks, handle)
        queues.put(work("a", 0, "first"))
        queues.put(work("a", 1, "second"))
        await asyncio.sleep(0)
        assert queues.holds("a", "first")  # handled now
        assert queues.holds("a", "second")  # queued behind it
        assert not queues.holds("a", "third") and not queues.holds("b", "first")
        gate.set()
        await asyncio.wait_for(queues.wait_idle(), 5)
        assert not queues.holds("a", "first") and not queues.holds("a", "second")
