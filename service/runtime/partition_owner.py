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
from collections.abc import Coroutine
from typing import Any, TypeVar

from aiokafka import TopicPartition
from aiokafka.errors import InvalidProducerEpoch, ProducerFenced

from service.runtime.command_path import NOT_THE_RECORDS
from service.runtime.control import ControlHandler
from service.runtime.idle_expiry import expire_idle, fetched_since
from service.runtime.left_open import (
    Repairing,
    published,
    repaired_partitions,
    restore_repaired,
)
from service.runtime.offsets import OffsetTracker
from service.runtime.owner_context import OwnerContext
from service.runtime.partition_parts import PartitionParts, assemble
from service.runtime.records import parse_command
from service.runtime.session_queue import SessionQueues
from service.runtime.stable_starts import stable_starts
from service.runtime.transactions import (
    SETTLE_S,
    WATCH_S,
    find_left_open,
    watch_stable_offsets,
)
from service.runtime.transport import CommitFailedError
from service.runtime.txn_stream import GroupFencedError, TransactionStream
from service.runtime.work import CommandWork, InputRecord, OutRecord
from service.sessions.store import SessionStore
from service.sessions.table import SqliteTable
from service.wire.errors import WireError

logger = logging.getLogger(__name__)

FENCING_ERRORS = (ProducerFenced, InvalidProducerEpoch, GroupFencedError)
_LAST_COMMIT_S = 2.0
"""Least time the last commit (with the input offsets) gets once the grace period is over."""


_T = TypeVar("_T")


class OwnerExit(enum.Enum):
    STOPPED = "stopped"
    FENCED = "fenced"
    FAILED = "failed"


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
        self._parts: PartitionParts | None = None
        self._queues: SessionQueues | None = None
        self._control: ControlHandler | None = None
        self._table: SqliteTable | None = None
        self._drained = False
        """The owner stopped with its last commit done (its local store can be trusted)."""
        self._log: str | None = None
        """The log of its commands partition (``<topic id>:<partition>``), asked at its start."""
        self.exit: OwnerExit | None = None
        self.error: BaseException | None = None
        """Why the owner failed (when ``exit`` is ``FAILED``)."""

    @property
    def restored(self) -> bool:
        return self._restored

    @property
    def transactions(self) -> int:
        """Transactions this owner committed."""
        return self._parts.committer.transactions if self._parts is not None else 0

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
        # No queued command starts from now on, not even in this event-loop turn, before the
        # drain runs: a running command may be left at its boundary in this very turn, and one
        # of its session behind it, answered, would make the next owner take it for a repeat.
        if self._queues is not None:
            self._queues.close()

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
            if self._parts is not None:
                self._parts.store.release()
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

        async def prepare() -> tuple[list[TopicPartition], SessionStore, list[OutRecord]]:
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
            topic_id = await self._ctx.sessions.topic_id(self._topics.commands)
            self._log = None if topic_id is None else f"{topic_id}:{self.partition}"

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
                durable_writes=False,
            )
            store, again = await restore_repaired(
                self._ctx.sessions,
                self._restore,
                abort,
                found,
                self._ctx.held,
                Repairing(self._topics, self.partition, self._ctx.metrics, SETTLE_S),
            )
            return written, store, again

        # Nothing is claimed or committed before the claim below: a stop asked meanwhile (a
        # drain, a revoke) ends the start at once, wherever it is, instead of after the grace
        # period. (A restore left midway is not kept: the store was not closed clean, so the
        # partition's next owner here reads it from the start.)
        written, store, again = await self._unless_stopped(prepare())
        self._parts = parts = assemble(
            self.partition,
            self._ctx,
            stream,
            store,
            self._trackers,
            on_finished=self._on_finished,
            stopping=self._stop_requested.is_set,
        )
        committer, cancels, path = parts.committer, parts.cancels, parts.path
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
            self._queues = SessionQueues(
                tasks, path.handle, track_reads=settings.sessions.idle_ttl_s is not None
            )
            self._control = ControlHandler(
                cancels,
                self._queues.put,
                self._queues.holds,
                path.undecodable,
                max_bytes=settings.runtime.state_record_max_bytes,
                partitions=self._ctx.partitions,
            )
            ttl_s = settings.sessions.idle_ttl_s
            if ttl_s is not None:
                tasks.create_task(
                    expire_idle(
                        ttl_s,
                        parts.writer,
                        committer.submit,
                        committer.flush,
                        self._queues,
                        self._stop_requested.is_set,
                        self._topics.events,
                        self._ctx.metrics,
                        parts.owns,
                        passed=committer.passed,
                        commands_topic=self._topics.commands,
                        commands_log=self._log,
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

    async def _unless_stopped(self, work: Coroutine[Any, Any, _T]) -> _T:
        """``work``'s result, or :class:`_StopRequestedError` (``work`` cancelled) once a stop is
        asked first."""
        task = asyncio.ensure_future(work)
        stopping = asyncio.ensure_future(self._stop_requested.wait())
        try:
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not task.done():
                task.cancel()
                await asyncio.wait({task})
        if task.cancelled():
            raise _StopRequestedError
        return task.result()

    async def _drain(self) -> None:
        """Let running steps reach a commit within the grace period; the rest is abandoned.

        The last commit carries the input offsets, so the next owner starts after the last
        answered command instead of re-reading what finished since offsets last joined.
        """
        queues, parts = self._queues, self._parts
        assert queues is not None and parts is not None
        committer, store = parts.committer, parts.store
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
            assert self._parts is not None
            self._parts.path.record_failed(record, exc)

    def _route_record(self, record: InputRecord) -> None:
        if record.unreadable is not None:
            assert self._parts is not None
            self._parts.path.undecodable(record, WireError(record.unreadable))
            return
        if record.origin.topic == self._topics.control:
            assert self._control is not None
            self._control.handle(record)
            return
        assert self._queues is not None and self._parts is not None
        record.log = self._log
        try:
            command = parse_command(
                record, self._ctx.settings.runtime.state_record_max_bytes, self._ctx.partitions
            )
        except WireError as exc:
            refused = self._parts.path.undecodable(record, exc)
            if refused is not None:
                self._queues.put(refused)
            return
        work = CommandWork(record, command.session_id, command)
        if command.type == "delete":
            taken = self._queues.holds(command.session_id, command.command_id)
            self._parts.cancels.deleting(work, command, taken=taken)
        self._queues.put(work)
        self._parts.cancels.arrived(work)
