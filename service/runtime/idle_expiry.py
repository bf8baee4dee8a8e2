"""Deleting the sessions of a partition nobody wrote to for longer than ``sessions.idle_ttl_s``.

Guarantee: a session is deleted only when it has no work queued, its last write is committed,
and the input offsets handed to a commit are past every record of it this owner read and past
the newest command it answered (its ids go with it: a record of it read again after a fault
would run again); the deletion (its tombstones) and its ``session_expired`` event go through the
partition's committer like any other write, so they are committed together or not at all.
Time the broker was out of reach does not count as idle: once the partition's fetches went
unanswered for longer than ``OUTAGE_MS`` (the broker away or restarting), nothing expires until a
whole ttl after they are answered again, so a command a client's producer held meanwhile reaches
its session before the session can be deleted under it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from aiokafka import TopicPartition

from service.observability.metrics import Metrics
from service.runtime.records import event_record
from service.runtime.session_queue import SessionQueues
from service.runtime.transport import InputSource
from service.runtime.work import Outcome
from service.sessions.store import StoredSession
from service.sessions.writer import SessionWriter

logger = logging.getLogger(__name__)

_BATCH = 500
"""Idle sessions looked at at once; a round takes batch after batch until none is left, each
once the deletes of the one before are committed."""
OUTAGE_MS = 3_000
"""Fetches unanswered this long (an idle partition's are answered every 0.5 s) mean the broker
was out of reach."""
_SAMPLE_S = 0.25
"""How often the fetch answers are looked at between rounds."""


@dataclass(slots=True)
class Outages:
    """What every owner of an instance saw of the broker's absences (epoch ms): the newest time
    one saw it away, and the newest time one saw it come back. Shared, so an owner made after
    the broker came back (its partition reassigned by the rebalance an outage brings, or its
    owner re-created after a failed commit) still holds expiry for a ttl after the return, even
    when the owners that saw the outage ended before they saw it end. A process started after
    an outage knows nothing of it."""

    away_ms: int = 0
    back_ms: int = 0

    @property
    def unfinished(self) -> bool:
        return self.away_ms > self.back_ms


class Reachability:
    """When the broker last came back for this owner's input partitions: the end of the newest
    stretch in which ``fetched`` (the newest fetch answer, epoch ms) lagged the wall clock by more
    than ``OUTAGE_MS``, or went without any answer since the owner started; or, sooner, what the
    instance's other owners saw (``outages``). An owner made while an outage the instance saw is
    unfinished counts itself away until its first answer."""

    def __init__(self, fetched: Callable[[], int | None], outages: Outages | None = None) -> None:
        self._fetched = fetched
        self._since_ms = int(time.time() * 1000)
        self._outages = outages if outages is not None else Outages()
        self._away = self._outages.unfinished
        self._back_ms = 0

    @property
    def back_ms(self) -> int:
        return max(self._back_ms, self._outages.back_ms)

    def sample(self) -> bool:
        """Whether fetches are answered now; notes the start and the end of an outage."""
        now_ms = int(time.time() * 1000)
        heard_ms = self._fetched()
        # Before the first answer, the lag counts from the owner's start.
        lag_ms = now_ms - (heard_ms if heard_ms is not None else self._since_ms)
        if lag_ms > OUTAGE_MS:
            self._away = True
            self._outages.away_ms = max(self._outages.away_ms, now_ms)
        elif heard_ms is not None and self._away:
            self._away = False
            self._back_ms = now_ms
            self._outages.back_ms = max(self._outages.back_ms, now_ms)
        return heard_ms is not None and not self._away


async def expire_idle(
    ttl_s: float,
    writer: SessionWriter,
    submit: Callable[[Outcome], None],
    committed: Callable[[], Awaitable[None]],
    queues: SessionQueues,
    stopping: Callable[[], bool],
    events_topic: str,
    metrics: Metrics,
    owns: Callable[[str], bool] | None = None,
    *,
    passed: Callable[[str, int], bool],
    commands_topic: str,
    commands_log: str | None = None,
    forgetting: Callable[[str, Iterable[str]], None],
    fetched: Callable[[], int | None],
    outages: Outages | None = None,
) -> None:
    """Delete, now and then, the sessions written to last more than ``ttl_s`` ago, each with
    a ``session_expired`` event; a session with work queued or a write not yet committed
    is left for the next round, and so is one with a record the input offsets have not
    ``passed`` yet (by topic and offset; the newest command a session answered counts only when
    it was of ``commands_log``, the owner's commands partition). Returns once ``stopping()`` is
    true; ``forgetting`` learns each deleted session's command ids. ``fetched`` gives the time
    (epoch ms) the broker last answered a fetch of every input partition of this owner, ``None``
    before each did: no round runs while it lags (see :class:`Reachability`), nor within
    ``ttl_s`` of its recovery or of one the instance's other owners saw (``outages``, shared by
    them). A round goes through every idle session, a batch at a time, and waits for each
    batch's deletes to be ``committed`` before it takes the next, so expiry keeps up with any
    rate of new sessions the partition commits, never with more deletes in flight than a batch.

    A session another partition owns (``owns`` says no: a stray copy written on the wrong
    partition before records off their key's partition were refused) is deleted without an
    event: the session itself lives on, on its own partition."""
    store = writer.store
    interval = min(max(ttl_s / 4, 0.5), 60.0)
    reach = Reachability(fetched, outages)
    ttl_ms = int(ttl_s * 1000)

    async def expire(session_id: str, written_ms: int, now_ms: int) -> None:
        if stopping() or queues.busy(session_id):
            return
        # An idle session is seldom still in the cache: a large one is decoded off the
        # event loop, and a command of it may come, run and commit meanwhile.
        await store.prefetch(session_id)
        if stopping() or queues.busy(session_id):
            return
        stored = store.get(session_id)
        if stored is None or not stored.durable or store.written_ms(session_id) != written_ms:
            return
        if not _passed(session_id, stored, queues, passed, commands_topic, commands_log):
            return
        applied = stored.delivery.applied
        write = writer.delete(session_id)
        forgetting(session_id, applied)
        queues.forget(session_id)
        idle_s = (now_ms - written_ms) / 1000
        if not stored.exists:
            # Only remembered command ids (a refusal's, a targeted cancel's): no session
            # to announce the end of.
            submit(Outcome(state=write))
            return
        if owns is not None and not owns(session_id):
            submit(Outcome(state=write))
            logger.warning(
                "session_id=<%s>, records=<%d> | stray copy of a session another partition "
                "owns, deleted",
                session_id,
                len(write.records),
            )
            return
        event = event_record(
            events_topic,
            session_id,
            applied[-1] if applied else "expired",
            stored.event_seq + 1,
            "session_expired",
            {"idle_s": max(idle_s, 0.0), "records": len(write.records)},
        )
        submit(Outcome(records=[event], state=write, counted=metrics.session_expired))
        logger.info(
            "session_id=<%s>, idle_s=<%.0f>, records=<%d> | idle session expired",
            session_id,
            idle_s,
            len(write.records),
        )

    while not stopping():
        answered = False
        for _ in range(max(1, round(interval / _SAMPLE_S))):
            await asyncio.sleep(min(interval, _SAMPLE_S))
            answered = reach.sample()
        queues.forget_passed(passed)
        now_ms = int(time.time() * 1000)
        if not answered or now_ms - reach.back_ms < ttl_ms:
            continue
        after: tuple[str, int] | None = None
        while not stopping():
            batch = store.idle(now_ms - ttl_ms, _BATCH, after)
            for session_id, written_ms in batch:
                await expire(session_id, written_ms, now_ms)
            if len(batch) < _BATCH:
                break
            after = batch[-1]
            await committed()
            if not reach.sample() or int(time.time() * 1000) - reach.back_ms < ttl_ms:
                break  # the broker went away meanwhile: its absence is no idle time


def _passed(
    session_id: str,
    stored: StoredSession,
    queues: SessionQueues,
    passed: Callable[[str, int], bool],
    commands_topic: str,
    commands_log: str | None,
) -> bool:
    """Every record of the session this owner read, and the newest command it answered (read
    by an earlier owner, perhaps not yet read again here, and of the same log), is behind the
    input offsets."""
    newest = queues.reads(session_id)
    through = stored.delivery.through_in(commands_log)
    if through is not None:
        newest[commands_topic] = max(newest.get(commands_topic, -1), through)
    return all(passed(topic, offset) for topic, offset in newest.items())


def fetched_since(
    inputs: InputSource, partitions: Iterable[TopicPartition]
) -> Callable[[], int | None]:
    """``fetched`` for :func:`expire_idle`: the newest time every one of ``partitions`` was
    answered by a fetch, counting only answers from now on (a stamp from before, of an earlier
    owner's position, says nothing of the records this owner has still to read)."""
    started_ms = int(time.time() * 1000)
    partitions = list(partitions)

    def fetched() -> int | None:
        stamps = [inputs.fetched_at(tp) for tp in partitions]
        if not stamps or any(stamp is None or stamp < started_ms for stamp in stamps):
            return None
        return min(stamp for stamp in stamps if stamp is not None)

    return fetched
