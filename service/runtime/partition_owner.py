"""The owner of one input partition: its session store, its work and its offsets, committed
through the instance's transaction stream.

Guarantees: no command of the partition runs before its input offsets are stable (no earlier
owner's transaction may still move them: it ended, or was aborted by fencing its producer), its
session store is restored, and its first commit claimed it under this instance's producer and
group generation; commands of one session run in topic order; once fenced, the owner never
writes again; on stop it starts nothing new, gives running steps a bounded grace period to reach
a commit, abandons the rest, and moves the input offsets in its last commit. A failure of any
call it makes of Kafka ends it ``FAILED`` (the runtime re-creates it, and the new owner starts
from the committed offsets and state), a fencing error ``FENCED``; one while it stops cuts the
last commit short. It starts every input topic at its committed offset (never where the
consumer happens to be); a record below its start is never taken, one fetched again only once.

It reaches Kafka only through its stream, the instance's :class:`InputSource` and
:class:`Sessions`, so these rules are unit-tested on the in-memory Kafka
(``tests/unit/runtime/test_owner_rules.py``), a failure injected at every call it makes.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import TopicPartition
from aiokafka.errors import InvalidProducerEpoch, ProducerFenced

from service.agent.definition import AgentDefinition
from service.observability.metrics import Metrics
from service.runtime.answers import Answers
from service.runtime.cancels import CancelDesk
from service.runtime.command_path import NOT_THE_RECORDS, CommandPath
from service.runtime.committer import CommitObserver, Committer
from service.runtime.control import ControlHandler
from service.runtime.faults import FaultPoints
from service.runtime.forks import SessionVersions
from service.runtime.idle_expiry import Outages, expire_idle, fetched_since
from service.runtime.invoker import Invoker
from service.runtime.left_open import (
    Held,
    Repairing,
    published,
    repaired_partitions,
    restore_repaired,
)
from service.runtime.offsets import OffsetTracker
from service.runtime.partitioning import session_owner
from service.runtime.records import parse_command
from service.runtime.restore import Sessions
from service.runtime.session_queue import SessionQueues
from service.runtime.stable_starts import stable_starts
from service.runtime.standby import Standby
from service.runtime.streams import Streams
from service.runtime.transactions import (
    SETTLE_S,
    WATCH_S,
    find_left_open,
    watch_stable_offsets,
)
from service.runtime.transport import CommitFailedError, InputSource
from service.runtime.txn_stream import GroupFencedError, TransactionStream
from service.runtime.work import CommandWork, InputRecord
from service.sessions.cache import SessionCache
from service.sessions.store import SessionStore
from service.sessions.table import SqliteTable
from service.sessions.writer import SessionWriter
from service.settings import Settings
from service.wire.errors import WireError

logger = logging.getLogger(__name__)

FENCING_ERRORS = (ProducerFenced, InvalidProducerEpoch, GroupFencedError)
_LAST_COMMIT_S = 2.0
"""Least time the last commit (with the input offsets) gets once the grace period is over."""


class OwnerExit(enum.Enum):
    STOPPED = "stopped"
    FENCED = "fenced"
    FAILED = "failed"


class InFlight:
    """Commands accepted by this instance and not yet committed; drives fetch backpressure."""

    __slots__ = ("count", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0

    @property
    def full(self) -> bool:
        return self.count >= self.limit


@dataclass(slots=True)
class OwnerContext:
    """What every owner of this instance shares."""

    settings: Settings
    agents: Mapping[str, AgentDefinition]
    inputs: InputSource
    """The instance's group consumer of the input topics (shared with the consumer loop)."""
    streams: Streams
    """Where each owner's transactions go (the instance's stream or one of its own)."""
    inflight: InFlight
    faults: FaultPoints
    on_restored: Callable[[int], None]
    sessions: Sessions
    store_root: Path
    """Folder of the local session stores, one subfolder per partition."""
    standby: Standby | None = None
    """Follows the partitions not owned here; an owner takes its partition's table from it."""
    observer: CommitObserver | None = None
    metrics: Metrics = field(default_factory=Metrics)
    partitions: int | None = None
    """Partition count of the input topics: a record whose key belongs on another partition
    (Kafka's default partitioner) is refused, and no state of a session another partition owns
    is written. ``None``: not checked (records placed without regard to their keys)."""
    held: dict[int, Held] = field(default_factory=dict)
    """By partition: what an owner that failed decided to publish again and did not publish."""
    cache: SessionCache = field(default_factory=SessionCache)
    """The decoded sessions of every owner, within the instance's one budget."""
    outages: Outages = field(default_factory=Outages)
    """What the owners saw of the broker's absences: idle expiry holds after one on every
    partition, whichever owner saw it."""


class _StopRequestedError(Exception):
    pass


class PartitionOwner:
    def __init__(self, partition: int, ctx: OwnerContext) -> None:
        self.partition = partition
        self._ctx = ctx
        self._topics = ctx.settings.topics
        self._accepting = False
        """Records are taken once the owner has sought to the stable committed offsets."""
        self._min_offsets: dict[str, int] = {}
        self._trackers: dict[str, OffsetTracker] = {}
        self._buffer: list[InputRecord] = []
        self._accepted = 0
        self._finished = 0
        self._restored = False
        self._stop_requested = asyncio.Event()
        self._grace_s = 0.0
        self._queues: SessionQueues | None = None
        self._committer: Committer | None = None
        self._store: SessionStore | None = None
        self._control: ControlHandler | None = None
        self._cancels: CancelDesk | None = None
        self._path: CommandPath | None = None
        self._table: SqliteTable | None = None
        self._drained = False
        """The owner stopped with its last commit done (its local store can be trusted)."""
        self.exit: OwnerExit | None = None
        self.error: BaseException | None = None
        """Why the owner failed (when ``exit`` is ``FAILED``)."""

    @property
    def restored(self) -> bool:
        return self._restored

    @property
    def transactions(self) -> int:
        """Transactions this owner committed."""
        return self._committer.transactions if self._committer is not None else 0

    def accept(self, record: InputRecord) -> None:
        """Take a fetched record of this partition (called by the consumer loop, in order)."""
        origin = record.origin
        if not self._accepting or self._stop_requested.is_set():
            return
        if origin.offset < self._min_offsets.get(origin.topic, 0):
            return
        tracker = self._trackers.get(origin.topic)
        if tracker is None or not tracker.accepts(origin.offset):
            # Fetched again after a seek, or of a topic the owner has no start for: a tracker
            # started at this record would pass every earlier one the consumer fetched before.
            return
        tracker.received(origin.offset)
        self._accepted += 1
        self._ctx.inflight.count += 1
        if self._queues is None:
            self._buffer.append(record)
        else:
            self._route(record)

    def request_stop(self, grace_s: float) -> None:
        self._grace_s = grace_s
        self._stop_requested.set()

    async def run(self) -> OwnerExit:
        try:
            async with self._ctx.streams.open(self.partition) as stream:
                await self._serve(stream)
        except* _StopRequestedError:
            self.exit = OwnerExit.STOPPED
        except* FENCING_ERRORS as group:
            logger.error(
                "partition=<%d>, reason=<%s> | producer fenced: its producer or the group "
                "membership it commits under is no longer current (another owner, or a "
                "rebalance)",
                self.partition,
                group.exceptions[0],
            )
            self.exit = OwnerExit.FENCED
        except* Exception as group:  # noqa: BLE001 - an owner's failure stays contained: it is re-created
            if self._stop_requested.is_set():
                self.exit = OwnerExit.STOPPED
            else:
                # The runtime logs it when it re-creates the owner.
                self.error = group.exceptions[0]
                self.exit = OwnerExit.FAILED
        finally:
            # An ended owner takes nothing more, whoever still holds it.
            self._accepting = False
            self._ctx.inflight.count -= self._accepted - self._finished
            self._accepted = self._finished
            if self._store is not None:
                self._store.release()
            if self._table is not None:
                if self._drained:
                    self._table.mark_clean()
                self._table.close()
        return self.exit or OwnerExit.STOPPED

    async def _serve(self, stream: TransactionStream) -> None:
        """Wait for stable input offsets (fencing a previous owner that holds them), repair what
        it left open, restore, claim the partition with a first commit, then run the partition's
        work until a stop request."""
        settings = self._ctx.settings
        inputs = [
            TopicPartition(topic, self.partition)
            for topic in (self._topics.commands, self._topics.control)
        ]
        runtime = settings.runtime
        starts = await stable_starts(
            stream,
            self._ctx.inputs,
            inputs,
            partition=self.partition,
            timeout_s=runtime.transaction_timeout_ms / 1000 + runtime.commit_timeout_s,
            settle_s=SETTLE_S,
        )
        written = await repaired_partitions(self._ctx.sessions, self._topics, self.partition)

        async def abort(partitions: list[TopicPartition]) -> None:
            writers = await stream.committed_metadata(inputs)
            for transactional_id in sorted(writers | {stream.transactional_id}):
                await stream.abort_as(transactional_id, partitions)

        found = await find_left_open(
            self._ctx.sessions,
            written,
            keep=frozenset(tp.topic for tp in written),
            settle_s=SETTLE_S,
        )
        self._seek(starts)
        await self._ctx.faults.before_restore(self.partition)
        if self._ctx.standby is not None:
            await self._ctx.standby.release(self.partition)
        self._table = SqliteTable(
            self._ctx.store_root / f"{self._topics.sessions}-{self.partition}",
            max_age_s=settings.sessions.local_max_age_s,
        )
        store, again = await restore_repaired(
            self._ctx.sessions,
            self._restore,
            abort,
            found,
            self._ctx.held,
            Repairing(self._topics, self.partition, self._ctx.metrics, SETTLE_S),
        )
        writer = SessionWriter(
            store,
            record_max_bytes=settings.runtime.state_record_max_bytes,
            versions_kept=settings.sessions.versions_kept,
        )
        committer = Committer(
            stream=stream,
            sessions_topic=self._topics.sessions,
            partition=self.partition,
            trackers=self._trackers,
            interval_s=settings.runtime.commit_interval_ms / 1000,
            offsets_every_s=settings.runtime.offsets_every_ms / 1000,
            observer=self._ctx.observer,
            on_finished=self._on_finished,
            on_durable=store.committed,
            metrics=self._ctx.metrics,
        )
        answers = Answers(
            writer=writer,
            submit=committer.submit,
            topics=self._topics,
            metrics=self._ctx.metrics,
            max_bytes=settings.runtime.state_record_max_bytes,
        )
        invoker = Invoker(
            writer=writer,
            submit=committer.submit,
            durable=committer.flush,
            stopping=self._stop_requested.is_set,
            topics=self._topics,
            answers=answers,
            state_max_bytes=settings.runtime.state_record_max_bytes,
            result_max_bytes=settings.sessions.result_max_bytes,
            metrics=self._ctx.metrics,
        )
        self._committer = committer
        self._store = store
        cancels = CancelDesk(
            writer=writer,
            submit=committer.submit,
            topics=self._topics,
            metrics=self._ctx.metrics,
            durable=committer.flush,
            settled=committer.settled_before,
        )
        self._cancels = cancels
        # The claim, before any work: the partition's offsets name this instance's producer from
        # now on (so a successor knows whom to fence), under this generation; what the committed
        # state says happened becomes visible before anything else.
        await committer.claim(again)
        self._ctx.held.pop(self.partition, None)
        published(again, store, self._topics.sessions)
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(committer.run())
            tasks.create_task(
                watch_stable_offsets(
                    self._ctx.sessions,
                    written,
                    limit_s=settings.runtime.commit_timeout_s + WATCH_S,
                )
            )
            owns = session_owner(self.partition, self._ctx.partitions)
            self._path = path = CommandPath(
                store=store,
                cancels=cancels,
                invoker=invoker,
                answers=answers,
                submit=committer.submit,
                agents=self._ctx.agents,
                topics=self._topics,
                versions=SessionVersions(
                    store=store,
                    writer=writer,
                    answers=answers,
                    submit=committer.submit,
                    topics=self._topics,
                    session_records=self._ctx.sessions.session_records,
                    max_bytes=settings.runtime.state_record_max_bytes,
                    metrics=self._ctx.metrics,
                    settled=committer.settled_before,
                ),
                faults=self._ctx.faults,
                metrics=self._ctx.metrics,
                owns=owns,
                settled=committer.settled_before,
            )
            self._queues = SessionQueues(
                tasks, path.handle, track_reads=settings.sessions.idle_ttl_s is not None
            )
            self._control = ControlHandler(
                cancels,
                self._queues.put,
                path.undecodable,
                max_bytes=settings.runtime.state_record_max_bytes,
                partitions=self._ctx.partitions,
            )
            ttl_s = settings.sessions.idle_ttl_s
            if ttl_s is not None:
                tasks.create_task(
                    expire_idle(
                        ttl_s,
                        writer,
                        committer.submit,
                        self._queues,
                        self._stop_requested.is_set,
                        self._topics.events,
                        self._ctx.metrics,
                        owns,
                        passed=committer.passed,
                        commands_topic=self._topics.commands,
                        forgetting=cancels.forgetting,
                        fetched=fetched_since(self._ctx.inputs, inputs),
                        outages=self._ctx.outages,
                    )
                )
            self._restored = True
            self._ctx.on_restored(self.partition)
            buffered, self._buffer = self._buffer, []
            for record in buffered:
                self._route(record)
            await self._stop_requested.wait()
            await self._drain()
            raise _StopRequestedError

    async def _drain(self) -> None:
        """Let running steps reach a commit within the grace period; the rest is abandoned.

        The last commit carries the input offsets, so the next owner starts after the last
        answered command instead of re-reading what finished since offsets last joined.
        """
        queues, committer, store = self._queues, self._committer, self._store
        assert queues is not None and committer is not None and store is not None
        queues.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._grace_s
        try:
            async with asyncio.timeout_at(deadline):
                await queues.wait_idle()
        except TimeoutError:
            logger.warning(
                "partition=<%d>, sessions=<%d> | grace period over, abandoning running steps",
                self.partition,
                queues.sessions,
            )
        try:
            async with asyncio.timeout_at(max(deadline, loop.time() + _LAST_COMMIT_S)):
                await committer.flush(final=True)
            store.flush()  # the table holds every commit before it is called clean
            self._drained = True
        except TimeoutError:
            logger.warning(
                "partition=<%d> | last commit unfinished, the next owner re-reads from the "
                "offsets committed before",
                self.partition,
            )

    async def _restore(self) -> SessionStore:
        assert self._table is not None
        return await self._ctx.sessions.restore(self.partition, self._table, cache=self._ctx.cache)

    def _seek(self, starts: dict[TopicPartition, int]) -> None:
        """Read from the stable committed offsets (before restore); the seeks and the switch to
        accepting records happen in one step, so no record fetched before a seek is taken and
        none after is lost."""
        topics = {self._topics.commands, self._topics.control}
        missing = sorted(topics - {tp.topic for tp in starts if tp.partition == self.partition})
        if missing:
            raise CommitFailedError(
                f"partition {self.partition}: no committed offsets to start {missing} from"
            )
        inputs = self._ctx.inputs
        for tp, offset in starts.items():
            inputs.seek(tp, offset)
            self._min_offsets[tp.topic] = offset
            self._trackers[tp.topic] = OffsetTracker(offset)
        self._accepting = True

    def _on_finished(self, count: int) -> None:
        self._finished += count
        self._ctx.inflight.count -= count

    def _route(self, record: InputRecord) -> None:
        try:
            self._route_record(record)
        except NOT_THE_RECORDS:
            raise
        except Exception as exc:  # noqa: BLE001 - a poison record must not stop the partition
            assert self._path is not None
            self._path.record_failed(record, exc)

    def _route_record(self, record: InputRecord) -> None:
        if record.origin.topic == self._topics.control:
            assert self._control is not None
            self._control.handle(record)
            return
        assert self._queues is not None and self._path is not None
        try:
            command = parse_command(
                record, self._ctx.settings.runtime.state_record_max_bytes, self._ctx.partitions
            )
        except WireError as exc:
            refused = self._path.undecodable(record, exc)
            if refused is not None:
                self._queues.put(refused)
            return
        work = CommandWork(record, command.session_id, command)
        if command.type == "delete":
            assert self._cancels is not None
            self._cancels.deleting(work, command)
        self._queues.put(work)
