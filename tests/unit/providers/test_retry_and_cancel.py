"""Retry arithmetic, Retry-After parsing and the cancel race, without any server."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from email.utils import formatdate

import pytest

from service.agent.cancel import CancelSignal
from service.providers.cancel_race import unless_cancelled, until_cancelled
from service.providers.config import RetryConfig
from service.providers.retry import (
    backoff_delay,
    parse_retry_after,
    redact,
    status_is_retryable,
)


def test_backoff_grows_exponentially_with_jitter_and_is_capped() -> None:
    policy = RetryConfig(initial_backoff_s=0.5, max_backoff_s=4.0)
    rng = random.Random(7)
    for retry, step in enumerate([0.5, 1.0, 2.0, 4.0, 4.0, 4.0]):
        delays = [backoff_delay(policy, retry, rng) for _ in range(200)]
        assert all(step / 2 <= d <= step for d in delays)
        assert max(delays) - min(delays) > step / 4, "jitter spreads the delays"


def test_retry_after_forms() -> None:
    assert parse_retry_after({"retry-after": "7"}) == 7.0
    assert parse_retry_after({"retry-after": "1.5"}) == 1.5
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    in_ten = formatdate(time.time() + 10, usegmt=True)
    parsed = parse_retry_after({"retry-after": in_ten})
    assert parsed is not None and 8 <= parsed <= 10
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None
    assert parse_retry_after({"retry-after": "-3"}) == 0.0


@pytest.mark.parametrize(
    ("status", "header", "retryable"),
    [
        (429, None, True),
        (500, None, True),
        (529, None, True),
        (408, None, True),
        (400, None, False),
        (401, None, False),
        (404, None, False),
        (400, "true", True),
        (503, "false", False),
    ],
)
def test_status_classification(status: int, header: str | None, retryable: bool) -> None:
    assert status_is_retryable(status, header) is retryable


def test_redact_removes_every_secret() -> None:
    assert redact("key sk-1 and sk-1 again", ["sk-1", ""]) == "key [redacted] and [redacted] again"


async def _source(closed: asyncio.Event, gate: asyncio.Event) -> AsyncIterator[int]:
    try:
        yield 1
        await gate.wait()
        yield 2
    finally:
        closed.set()


async def test_immediate_cancel_interrupts_a_blocked_read_and_closes_the_source() -> None:
    closed, gate, cancel = asyncio.Event(), asyncio.Event(), CancelSignal()
    seen = []
    async for item in until_cancelled(_source(closed, gate), cancel):
        seen.append(item)
        asyncio.get_running_loop().call_later(0.05, cancel.cancel)
    assert seen == [1]
    assert closed.is_set()


async def test_deferred_cancel_lets_the_stream_finish() -> None:
    closed, gate, cancel = asyncio.Event(), asyncio.Event(), CancelSignal()
    seen = []
    async for item in until_cancelled(_source(closed, gate), cancel):
        seen.append(item)
        cancel.cancel(after_current_tools=True)
        gate.set()
    assert seen == [1, 2]


async def test_unless_cancelled_abandons_the_awaitable() -> None:
    cancel = CancelSignal()
    started = asyncio.Event()
    aborted = asyncio.Event()

    async def slow() -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            aborted.set()
            raise
        return "late"

    async def cancel_later() -> None:
        await started.wait()
        cancel.cancel()

    canceller = asyncio.create_task(cancel_later())
    assert await asyncio.wait_for(unless_cancelled(slow(), cancel), 5) is None
    await canceller
    assert aborted.is_set()


async def test_unless_cancelled_returns_the_value() -> None:
    async def quick() -> str:
        return "ok"

    assert await unless_cancelled(quick(), CancelSignal()) == "ok"
