"""The wait for the broker and the topics: which failures it waits out, how long between
attempts, what readiness is told, and that a stop ends it at once."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka.errors import KafkaConnectionError

from service.runtime import startup
from service.runtime.restart_backoff import RestartBackoff
from service.runtime.topics import MissingTopicsError, TopicLayoutError
from service.settings import KafkaSettings, TopicSettings


def _verify_with(monkeypatch: pytest.MonkeyPatch, answers: list[BaseException | int]) -> None:
    async def verify(kafka: KafkaSettings, topics: TopicSettings) -> int:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    monkeypatch.setattr(startup, "verify_topics", verify)


async def _wait(stop: asyncio.Event, told: list[str | None]) -> int | None:
    return await startup.wait_for_topics(
        KafkaSettings(bootstrap_servers="broker:9092"),
        TopicSettings(),
        stop,
        waiting=told.append,
        backoff=RestartBackoff(initial_s=0.001, cap_s=0.004),
    )


async def test_unreachable_then_missing_topics_are_waited_out(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _verify_with(
        monkeypatch,
        [KafkaConnectionError("no route"), OSError("refused"), MissingTopicsError("missing x"), 6],
    )
    told: list[str | None] = []
    assert await _wait(asyncio.Event(), told) == 6
    assert told[-1] is None
    assert [reason.split(":")[0] for reason in told[:-1] if reason] == [
        "broker broker",
        "broker broker",
        "missing x",
    ]
    attempts = [r for r in caplog.records if "not serving yet" in r.getMessage()]
    assert [r.levelname for r in attempts] == ["WARNING"] * 3
    assert "retry_in_s=<0.0>" in attempts[0].getMessage()


async def test_a_layout_no_wait_can_fix_ends_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    _verify_with(monkeypatch, [TopicLayoutError("co-partitioned topics must ...")])
    with pytest.raises(TopicLayoutError, match="co-partitioned"):
        await _wait(asyncio.Event(), [])


async def test_a_stop_ends_the_wait_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    _verify_with(monkeypatch, [KafkaConnectionError("down")] * 2)
    stop = asyncio.Event()
    told: list[str | None] = []
    waiting = asyncio.create_task(
        startup.wait_for_topics(
            KafkaSettings(), TopicSettings(), stop, waiting=told.append, backoff=RestartBackoff()
        )
    )
    while not told:
        await asyncio.sleep(0.001)
    started = time.monotonic()
    stop.set()
    assert await waiting is None
    assert time.monotonic() - started < 0.2
    # Readiness no longer names a reason for a wait that is over (a drain ended it).
    assert told[0] is not None and told[-1] is None


def test_the_wait_doubles_up_to_its_cap() -> None:
    backoff = RestartBackoff(initial_s=startup.FIRST_WAIT_S, cap_s=startup.MAX_WAIT_S)
    assert [backoff.failed() for _ in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
