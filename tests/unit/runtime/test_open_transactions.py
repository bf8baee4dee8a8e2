"""What a new owner does with open transactions on the partitions it writes (no broker)."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import TopicPartition

from service.observability.metrics import Metrics
from service.runtime.transactions import (
    Abort,
    HangingTransactionError,
    OpenTransactionsReader,
    StuckTransactionError,
    end_left_open,
    find_left_open,
    watch_stable_offsets,
)
from service.runtime.work import OutRecord

SESSIONS = TopicPartition("t.sessions", 3)
RESULTS = TopicPartition("t.results", 3)


class Offsets:
    """Serves (stable, end) per partition: a gap closes after as many lookups as ``gaps`` says
    (never when negative), and every gap closes at the fake aborts's abort if
    ``abort_closes``."""

    def __init__(self, gaps: dict[TopicPartition, int | None], *, abort_closes: bool) -> None:
        self.gaps = gaps
        self.abort_closes = abort_closes
        self.lookups = 0

    async def stable_and_end(
        self, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, tuple[int, int]]:
        self.lookups += 1
        found = {}
        for tp in partitions:
            closes_after = self.gaps.get(tp)
            gap = closes_after is not None and (closes_after < 0 or self.lookups <= closes_after)
            found[tp] = (10, 12) if gap else (12, 12)
        return found

    async def read_open(self, tp: TopicPartition, start: int, end: int) -> list[OutRecord]:
        return [
            OutRecord(tp.topic, b"k", f"{tp.topic}@{offset}".encode())
            for offset in range(start, end)
        ]

    def aborted(self) -> None:
        if self.abort_closes:
            self.gaps = {}


class Aborts:
    """The abort-only transactions asked for, each closing the gaps if the offsets say so."""

    def __init__(self, offsets: Offsets) -> None:
        self.offsets = offsets
        self.calls: list[list[TopicPartition]] = []

    async def __call__(self, partitions: list[TopicPartition]) -> None:
        self.calls.append(partitions)
        self.offsets.aborted()


async def resolve(
    abort: Abort,
    reader: OpenTransactionsReader,
    partitions: list[TopicPartition],
    metrics: Metrics,
    *,
    keep: frozenset[str] = frozenset(),
    settle_s: float = 1.0,
) -> list[OutRecord]:
    """Find what is left open, then end it, as a new owner does (with its restore between)."""
    found = await find_left_open(reader, partitions, keep=keep, settle_s=settle_s)
    await end_left_open(abort, reader, found, metrics, settle_s=settle_s)
    return found.records


def counted(metrics: Metrics, topic: str) -> float:
    value = metrics.registry.get_sample_value(
        "cairn_hanging_transactions_aborted_total", {"topic": topic}
    )
    return value or 0.0


async def test_no_gap_writes_nothing() -> None:
    offsets = Offsets({}, abort_closes=True)
    aborts = Aborts(offsets)
    await resolve(aborts, offsets, [SESSIONS, RESULTS], Metrics())
    assert aborts.calls == []
    assert offsets.lookups == 1


async def test_a_gap_that_closes_by_itself_is_waited_for() -> None:
    offsets = Offsets({SESSIONS: 3}, abort_closes=True)
    aborts = Aborts(offsets)
    await resolve(
        aborts,
        offsets,
        [SESSIONS, RESULTS],
        Metrics(),
        settle_s=5.0,
    )
    assert aborts.calls == []


async def test_a_hanging_transaction_is_aborted_on_its_partition_only() -> None:
    offsets = Offsets({SESSIONS: -1}, abort_closes=True)
    aborts = Aborts(offsets)
    metrics = Metrics()
    left = await resolve(
        aborts,
        offsets,
        [SESSIONS, RESULTS],
        metrics,
        keep=frozenset({SESSIONS.topic}),
        settle_s=0.1,
    )
    assert [r.value for r in left] == [b"t.sessions@10", b"t.sessions@11"]
    assert aborts.calls == [[SESSIONS]]
    assert counted(metrics, SESSIONS.topic) == 1
    assert counted(metrics, RESULTS.topic) == 0


async def test_a_gap_our_abort_cannot_end_stops_the_owner() -> None:
    offsets = Offsets({RESULTS: -1}, abort_closes=False)
    aborts = Aborts(offsets)
    metrics = Metrics()
    with pytest.raises(HangingTransactionError, match=r"t\.results-3"):
        await resolve(
            aborts,
            offsets,
            [SESSIONS, RESULTS],
            metrics,
            settle_s=0.1,
        )
    assert aborts.calls == [[RESULTS]]
    assert counted(metrics, RESULTS.topic) == 0


class Series:
    """Serves a scripted (stable, end) per look for one partition; a look past the script, or
    one scripted as an exception, fails the way a broker away would."""

    def __init__(self, looks: list[tuple[int, int] | Exception]) -> None:
        self.looks = looks

    async def stable_and_end(
        self, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, tuple[int, int]]:
        look = self.looks.pop(0) if self.looks else ConnectionError("no broker")
        if isinstance(look, Exception):
            raise look
        return dict.fromkeys(partitions, look)

    async def read_open(self, tp: TopicPartition, start: int, end: int) -> list[OutRecord]:
        raise AssertionError("a running owner reads no open batch")


async def _watch(looks: list[tuple[int, int] | Exception], limit_s: float) -> int:
    """How many looks the watch took before it raised (it is stopped after the script)."""
    series = Series(looks)
    total = len(looks)
    with pytest.raises(StuckTransactionError):
        await asyncio.wait_for(
            watch_stable_offsets(series, [SESSIONS], limit_s=limit_s, interval_s=0.01), 1.0
        )
    return total - len(series.looks)


async def test_a_gap_stuck_at_one_offset_past_the_limit_fails_the_owner() -> None:
    looks: list[tuple[int, int] | Exception] = [(12, 12), (12, 15)] + [(12, 15)] * 20
    assert 3 < await _watch(looks, limit_s=0.03) < 20


async def test_gaps_of_transactions_that_end_and_failed_looks_are_not_findings() -> None:
    # The stable offset moves on at every look (each commit ends), or the look fails: the
    # watch never raises; it stops only when the test stops waiting.
    moving: list[tuple[int, int] | Exception] = [(10 + i, 14 + i) for i in range(30)]
    failing: list[tuple[int, int] | Exception] = [(12, 15)] + [ConnectionError("away")] * 30
    for looks in (moving, failing):
        series = Series(list(looks))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(
                watch_stable_offsets(series, [SESSIONS], limit_s=0.05, interval_s=0.01),
                0.2,
            )
