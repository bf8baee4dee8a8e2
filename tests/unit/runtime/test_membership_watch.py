"""The membership check of readiness: current while aiokafka holds a generation and reaches the
group coordinator, lapsed once the coordinator stayed out of reach for a session timeout (the
group has expired the membership by then), current again only once the coordinator answered a
heartbeat for it, or under the generation of a rejoin."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from aiokafka import AIOKafkaConsumer

from service.observability.readiness import RestoreTracker
from service.runtime.group_member import MembershipWatch


def _consumer() -> Any:
    coordinator = SimpleNamespace(generation=3, member_id="m-1", coordinator_id=1)
    return SimpleNamespace(_coordinator=coordinator)


def _watch(consumer: Any, now: list[float]) -> MembershipWatch:
    return MembershipWatch(
        cast(AIOKafkaConsumer, consumer), session_timeout_s=6.0, clock=lambda: now[0]
    )


def test_a_coordinator_out_of_reach_for_a_session_timeout_lapses_the_membership() -> None:
    consumer, now = _consumer(), [100.0]
    watch = _watch(consumer, now)
    assert watch.lost() is None
    consumer._coordinator.coordinator_id = None  # a request to it failed
    assert watch.lost() is None
    now[0] = 105.9
    assert watch.lost() is None
    now[0] = 106.0
    assert "past the session timeout" in str(watch.lost())
    now[0] = 160.0
    assert "unreachable for 60 s" in str(watch.lost())

    consumer._coordinator.coordinator_id = 1  # found again, before any heartbeat answered
    assert "reachable again" in str(watch.lost())
    consumer._coordinator.generation = -1  # aiokafka's heartbeat: the member is unknown
    consumer._coordinator.member_id = ""
    assert "joining" in str(watch.lost())
    consumer._coordinator.generation = 4  # rejoined
    consumer._coordinator.member_id = "m-2"
    assert watch.lost() is None
    consumer._coordinator.coordinator_id = None
    now[0] = 161.0
    assert watch.lost() is None  # a new lapse is dated afresh


async def test_a_generation_judged_expired_is_current_again_once_a_heartbeat_answers() -> None:
    # A coordinator back from a restart may still know the member: one heartbeat of our own
    # proves it, and nothing else makes the generation current again.
    consumer, now = _consumer(), [100.0]
    watch = _watch(consumer, now)
    consumer._coordinator.coordinator_id = None
    assert watch.lost() is None
    now[0] = 107.0
    assert "past the session timeout" in str(watch.lost())
    answers: asyncio.Queue[bool | None] = asyncio.Queue()
    asked: list[int] = []

    async def ask() -> bool | None:
        asked.append(consumer._coordinator.generation)
        return await answers.get()

    proving = asyncio.create_task(watch.run(ask, retry_s=0.0))
    try:
        await asyncio.sleep(0)
        assert asked == []  # no request while the coordinator is out of reach
        consumer._coordinator.coordinator_id = 1
        assert "reachable again" in str(watch.lost())
        async with asyncio.timeout(10):
            while not asked:
                await asyncio.sleep(0)
        answers.put_nowait(None)  # no answer: still not current, asked again
        assert "reachable again" in str(watch.lost())
        async with asyncio.timeout(10):
            while len(asked) < 2:
                await asyncio.sleep(0)
        assert "reachable again" in str(watch.lost())
        answers.put_nowait(True)
        async with asyncio.timeout(10):
            while watch.lost() is not None:
                await asyncio.sleep(0)
        assert asked == [3, 3]
    finally:
        proving.cancel()


async def test_a_heartbeat_that_raises_is_asked_again_without_ending_the_watch() -> None:
    consumer, now = _consumer(), [100.0]
    watch = _watch(consumer, now)
    consumer._coordinator.coordinator_id = None
    assert watch.lost() is None
    now[0] = 107.0
    assert watch.lost() is not None
    consumer._coordinator.coordinator_id = 1
    assert "reachable again" in str(watch.lost())
    answers: list[BaseException | bool] = [RuntimeError("a bug in the probe"), True]

    async def ask() -> bool | None:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    proving = asyncio.create_task(watch.run(ask, retry_s=0.0))
    try:
        async with asyncio.timeout(10):
            while watch.lost() is not None:
                assert not proving.done(), proving
                await asyncio.sleep(0)
        assert answers == []
    finally:
        proving.cancel()


def test_no_generation_is_no_membership() -> None:
    consumer, now = _consumer(), [0.0]
    watch = _watch(consumer, now)
    consumer._coordinator.generation = -1  # reset: the coordinator no longer knew the member
    consumer._coordinator.member_id = ""
    assert "joining" in str(watch.lost())


def test_readiness_follows_the_membership() -> None:
    lost: list[str | None] = [None]
    tracker = RestoreTracker()
    tracker.membership(lambda: lost[0])
    tracker.assigned([0])
    tracker.restored(0)
    assert tracker()
    assert "membership" not in tracker.describe()

    lost[0] = "group coordinator unreachable"
    assert not tracker()
    assert tracker.describe()["membership"] == "group coordinator unreachable"

    lost[0] = None
    assert tracker()
    tracker.membership(None)  # out of the group: nothing to ask
    assert tracker()
