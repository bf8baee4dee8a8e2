"""The committer of one partition: batches its finished work into its share of the next
transaction of its stream (the instance's, or the partition's own).

Guarantee: an outcome's records, its session state and the input offsets it finishes become
visible together or not at all; an outcome no session state records (``replay_unsafe``: a dead
letter, an answer to a command of no session) is committed only once every earlier record of
its input partition is, in a commit that moves the input offsets past its own, so no later
owner reads it again and answers it twice; transactions never span a model or tool call (they
hold only work already done), one partition has at most one share in flight at any moment,
every share of a stream shared by the instance carries the partition's input offsets (what
fences a zombie's transaction), and a final flush moves the input offsets to where the
partition's work ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable

from aiokafka import TopicPartition
from aiokafka.structs import OffsetAndMetadata

from service.observability.metrics import Metrics
from service.runtime.commit_stats import CommitReport
from service.runtime.offsets import OffsetTracker
from service.runtime.txn_stream import UNWRITABLE_ERRORS, CommitFailedError, TransactionStream
from service.runtime.work import Origin, Outcome, OutRecord
from service.sessions.store import event_seq_header, event_seq_of
from service.sessions.table import Row

logger = logging.getLogger(__name__)

CommitObserver = Callable[[CommitReport], None]
"""Called after each commit with what it held and how long it took."""


DurableObserver = Callable[[list[Row], int, dict[str, int]], None]
"""Told of the session state records of each committed transaction, in log order, with the
sessions offset after them and the store version each session's write had."""


class Committer:
    def __init__(
        self,
        *,
        stream: TransactionStream,
        sessions_topic: str,
        partition: int,
        trackers: dict[str, OffsetTracker],
        interval_s: float,
        offsets_every_s: float,
        observer: CommitObserver | None = None,
        on_finished: Callable[[int], None] | None = None,
        on_durable: DurableObserver | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._stream = stream
        self._on_durable = on_durable
        self._store_stale = False
        self._metrics = metrics if metrics is not None else Metrics()
        self._sessions_topic = sessions_topic
        self._partition = partition
        self._trackers = trackers
        self._always_offsets = stream.shared
        self._fence = self._positions() if self._always_offsets else {}
        """The input offsets as last committed: what a share carries when they must not move."""
        self._interval_s = interval_s
        self._offsets_every_s = offsets_every_s
        self._offsets_committed_at = -math.inf
        """When offsets last joined a commit (monotonic; never: the first commit carries them,
        however young the host's clock)."""
        self._offsets_lagging = False
        self._observer = observer
        self._on_finished = on_finished
        self._pending: list[Outcome] = []
        self._held: list[Outcome] = []
        """Outcomes no state records, waiting for the records before theirs (not submitted
        yet: a flush does not wait for them, and a stopping owner leaves them to the next)."""
        self._wakeup = asyncio.Event()
        self._submitted = 0
        self._committed = 0
        self._offsets_asked = 0
        self._offsets_served = 0
        self._final = False
        self.transactions = 0
        """Transactions this partition had a share in so far."""
        self._progress = asyncio.Condition()

    async def claim(self, records: list[OutRecord]) -> None:
        """The partition's first commit, before any work: its input offsets as they are, under
        this instance's producer and group generation, with ``records`` (what must be visible
        before anything else)."""
        await self._stream.transact(self._partition, records, self._positions(), claim=True)
        self.transactions += 1

    def submit(self, outcome: Outcome) -> None:
        if outcome.replay_unsafe and not self._passable(outcome):
            self._held.append(outcome)
            return
        self._pending.append(outcome)
        self._submitted += 1
        self._wakeup.set()

    def _passable(self, outcome: Outcome) -> bool:
        """Every record before those ``outcome`` finishes is handed to a commit: the commit
        that finishes them moves the input offsets past them."""
        return all(
            self._trackers[origin.topic].position >= origin.offset for origin in outcome.finished
        )

    def _release(self, batch: list[Outcome]) -> None:
        """Add to ``batch`` the held outcomes whose earlier records it finished (each one
        released may let a later one go), finishing their records too."""
        while self._held:
            ready: list[Outcome] = []
            waiting: list[Outcome] = []
            for outcome in self._held:
                (ready if self._passable(outcome) else waiting).append(outcome)
            if not ready:
                return
            self._held = waiting
            self._submitted += len(ready)
            for outcome in ready:
                self._finish(outcome)
            batch.extend(ready)

    def _finish(self, outcome: Outcome) -> None:
        for origin in outcome.finished:
            self._trackers[origin.topic].finished(origin.offset)

    async def flush(self, *, final: bool = False) -> None:
        """Wait until everything submitted so far is committed (or the committer died).

        ``final`` is the flush before the partition is handed over: it waits for a commit that
        puts the input offsets in, whatever ``offsets_every_s`` says, so the next owner does not
        re-read commands already answered; every later commit carries them too.
        """
        target = self._submitted
        asked = self._offsets_asked
        if final:
            self._final = True
            asked = self._offsets_asked = self._offsets_asked + 1
            self._wakeup.set()
        async with self._progress:
            await self._progress.wait_for(
                lambda: self._committed >= target and self._offsets_served >= asked
            )

    def passed(self, topic: str, offset: int) -> bool:
        """The input offsets handed to a commit are past ``offset`` of ``topic``: a later owner
        never reads that record again (a failed commit fails this owner first)."""
        return self._trackers[topic].committed > offset

    async def settled_before(self, origin: Origin) -> None:
        """Wait until every record of ``origin``'s input partition before it is finished and
        handed to a commit: the commit that then finishes ``origin`` moves the input offsets
        past it, so no later owner reads it again."""
        tracker = self._trackers[origin.topic]
        async with self._progress:
            await self._progress.wait_for(lambda: tracker.position >= origin.offset)

    async def run(self) -> None:
        """Commit forever; raises :class:`CommitFailedError` (or a fencing error) on failure."""
        last_start = -math.inf
        while True:
            if self._offsets_lagging:
                # Idle with offsets behind: an offsets-only commit follows after the interval.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._offsets_every_s):
                        await self._wakeup.wait()
            else:
                await self._wakeup.wait()
            delay = last_start + self._interval_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            self._wakeup.clear()
            batch, self._pending = self._pending, []
            if not batch and not self._offsets_lagging and not self._offsets_due:
                continue
            last_start = time.monotonic()
            await self._commit(batch)
            async with self._progress:
                self._committed += len(batch)
                self._progress.notify_all()

    @property
    def _offsets_due(self) -> bool:
        return self._offsets_asked > self._offsets_served

    async def _commit(self, batch: list[Outcome]) -> None:
        """Commit ``batch`` (with the held outcomes it lets go, appended to it)."""
        started = time.monotonic()
        for outcome in batch:
            self._finish(outcome)
        self._release(batch)
        records, results, states = self._records_of(batch)
        finished = sum(len(outcome.finished) for outcome in batch)
        asked = self._offsets_asked
        if (
            not batch
            or self._final
            or any(outcome.replay_unsafe for outcome in batch)
            or started - self._offsets_committed_at >= self._offsets_every_s
        ):
            moved = {
                TopicPartition(topic, self._partition): OffsetAndMetadata(position, "")
                for topic, tracker in self._trackers.items()
                if (position := tracker.take_commit()) is not None
            }
            self._offsets_committed_at = started
        else:
            moved = {}
        offsets = self._positions() if self._always_offsets else moved
        self._offsets_lagging = any(
            tracker.position != tracker.committed for tracker in self._trackers.values()
        )
        if records or offsets:
            try:
                position = await self._transact(records, offsets)
            except UNWRITABLE_ERRORS as exc:
                await self._isolate(batch, offsets, exc)
            else:
                self._made_durable(batch, states, position)
        if self._always_offsets:
            self._fence = offsets
        self._offsets_served = asked
        if self._on_finished is not None:
            self._on_finished(finished)
        if self._observer is not None:
            self._observer(
                CommitReport(
                    outcomes=len(batch),
                    records=len(records),
                    results=results,
                    state_bytes=sum(len(s.value or b"") for s in states),
                    states=len(states),
                )
            )

    def _positions(self) -> dict[TopicPartition, OffsetAndMetadata]:
        """The input offsets as handed out for commit by the trackers."""
        return {
            TopicPartition(topic, self._partition): OffsetAndMetadata(tracker.committed, "")
            for topic, tracker in self._trackers.items()
        }

    async def _transact(
        self, records: list[OutRecord], offsets: dict[TopicPartition, OffsetAndMetadata]
    ) -> int:
        """Commit a share; returns the sessions offset after what it wrote there."""
        position = await self._stream.transact(self._partition, records, offsets)
        self.transactions += 1
        return position

    async def _isolate(
        self,
        batch: list[Outcome],
        offsets: dict[TopicPartition, OffsetAndMetadata],
        error: BaseException,
    ) -> None:
        """The broker refused some record of ``batch`` for good: commit its outcomes one by one
        (with the input offsets as they were), each refused one replaced by its fallback (or
        dropped), then the input offsets.

        Retrying the batch as it is would fail the same way for ever and stop the partition.
        """
        logger.warning(
            "partition=<%d>, outcomes=<%d>, error=<%s> | a record was refused for good, "
            "committing the batch's outcomes one by one",
            self._partition,
            len(batch),
            error,
        )
        refused: set[str] = set()
        for outcome in batch:
            state = outcome.state
            if state is not None and state.session_id in refused:
                # Written as a change of the refused state, which is not on the changelog: the
                # owner starts again from what is, and the rest of the batch is redone.
                raise CommitFailedError(
                    f"partition {self._partition}: a later write of session "
                    f"{state.session_id!r} follows one the broker refused"
                )
            if not await self._commit_alone(outcome) and state is not None:
                refused.add(state.session_id)
        if offsets:
            await self._transact([], offsets)
        if self._store_stale:
            # The store holds a session state the changelog does not: start again from it.
            raise CommitFailedError(
                f"partition {self._partition}: a session state was refused and dropped"
            )

    async def _commit_alone(self, outcome: Outcome) -> bool:
        """Commit one outcome, or the first of its replacements the broker takes (a replacement
        may have a fallback of its own, smaller still); False when it was refused."""
        records, _, states = self._records_of([outcome])
        if not records:
            return True
        attempt: Outcome | None = outcome
        while attempt is not None:
            records, _, states = self._records_of([attempt])
            try:
                position = await self._transact(records, self._fence)
            except UNWRITABLE_ERRORS as exc:
                attempt.unwritten = exc
                attempt = attempt.fallback(exc) if attempt.fallback else None
                continue
            self._made_durable([attempt], states, position)
            if attempt is outcome:
                return True
            self._metrics.unwritable("fallback")
            logger.error(
                "partition=<%d>, records=<%d>, error=<%s> | output refused by the broker, "
                "answered with a small error result instead (with a dead letter of the "
                "command, unless the broker refused that too)",
                self._partition,
                len(records),
                outcome.unwritten,
            )
            return False
        self._metrics.unwritable("dropped")
        logger.error(
            "partition=<%d>, error=<%s> | output refused by the broker and nothing could be "
            "written in its place: dropped",
            self._partition,
            outcome.unwritten,
        )
        if outcome.state is not None:
            self._store_stale = True
        return False

    def _records_of(self, batch: list[Outcome]) -> tuple[list[OutRecord], int, list[OutRecord]]:
        """Every record of the batch in order, then the session state records: of a key written
        twice only the last, in the place of its last write (each session's head after its
        history records)."""
        records: list[OutRecord] = []
        states: dict[bytes, OutRecord] = {}
        results = 0
        for outcome in batch:
            records.extend(outcome.records)
            results += outcome.results
            state = outcome.state
            if state is None:
                continue
            head = state.session_id.encode()
            for key, value in state.records:
                states.pop(key, None)
                states[key] = OutRecord(
                    topic=self._sessions_topic,
                    key=key,
                    value=value,
                    headers=[event_seq_header(state.event_seq)] if key == head else [],
                    partition=self._partition,
                )
        records.extend(states.values())
        return records, results, list(states.values())

    def _made_durable(self, batch: list[Outcome], states: list[OutRecord], position: int) -> None:
        for outcome in batch:
            if outcome.counted is not None:
                outcome.counted()
        if self._on_durable is None or not states:
            return
        versions = {o.state.session_id: o.state.version for o in batch if o.state is not None}
        now_ms = int(time.time() * 1000)
        rows = [(r.key or b"", r.value, event_seq_of(r.headers), now_ms) for r in states]
        self._on_durable(rows, position, versions)
