"""The runtime of one instance: group membership, one owner per assigned partition, the drain.

Guarantees: partition *p* of commands and control is owned here together (range assignor over
co-partitioned topics) and by at most one live owner at a time; on revocation and on shutdown,
owners drain within the grace period before their producers close; a failed owner is replaced
by a fresh one that re-reads from the committed offsets and the committed state, after a wait
that grows with the failures in a row (the instance is not ready meanwhile); a fenced owner is
replaced only if the group still assigns its partition here a session timeout later. Either is
re-created only once the group coordinator has answered a heartbeat sent after that wait: an
instance woken from a pause past the session timeout still holds the assignment it lost, and
an owner re-created then would fence the partition's new owner. Until the broker answers and
the topics exist it waits (``service.runtime.startup``), not ready, and a stop ends that wait
at once. A drain (``service.runtime.drain``) in any phase leaves the group, or never joins it,
and the instance then holds nothing until its stop signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import InvalidTransactionTimeout

from service.agent.definition import AgentDefinition
from service.observability.operability import Operability
from service.runtime.clients import connection_options, started, stop_consumer
from service.runtime.commit_stats import CommitStats
from service.runtime.consumer_loop import ConsumerLoop
from service.runtime.drain import Drain, StopOrDrain
from service.runtime.faults import FaultPoints
from service.runtime.group_member import KafkaGroupMember, MembershipWatch
from service.runtime.kafka_transport import KafkaInput, KafkaTransport
from service.runtime.loop_lag import LoopLag
from service.runtime.owner_context import InFlight, OwnerContext
from service.runtime.partition_owner import OwnerExit, PartitionOwner
from service.runtime.rebalance import RebalanceListener
from service.runtime.restart_backoff import RestartBackoff
from service.runtime.restore import SessionsReader
from service.runtime.standby import Standby
from service.runtime.startup import wait_for_topics
from service.runtime.streams import InstanceStream, PartitionStreams, Streams
from service.runtime.transactional_ids import (
    instance_transactional_id,
    partition_transactional_id,
    transactional_id_prefix,
)
from service.runtime.transport import GroupMember, TransactionTimeoutRefused, discard
from service.runtime.txn_stream import TransactionStream
from service.runtime.txn_v2 import KafkaTxnV2Producer
from service.sessions.cache import SessionCache
from service.settings import Settings

logger = logging.getLogger(__name__)


TIMEOUT_REFUSED = (TransactionTimeoutRefused, InvalidTransactionTimeout)
"""What a producer's start raises when the broker refuses its transaction timeout (the
service's own InitProducerId, aiokafka's with ``transactions_version=1``)."""


class SettingRefused(RuntimeError):
    """The broker refuses a setting the instance cannot run without: no retry can help, so the
    instance leaves its group and the start ends in one line naming the setting."""


class OwnerFactory(Protocol):
    """Makes the owner of one partition (tests put a stand-in here)."""

    def __call__(self, partition: int, ctx: OwnerContext) -> PartitionOwner: ...


_STOP_MARGIN_S = 10.0


class Runtime:
    def __init__(
        self,
        settings: Settings,
        agents: Mapping[str, AgentDefinition],
        *,
        operability: Operability | None = None,
        owner_factory: OwnerFactory = PartitionOwner,
        restart_backoff: Callable[[], RestartBackoff] = RestartBackoff,
    ) -> None:
        self._settings = settings
        self._agents = agents
        self._lag = LoopLag()
        self._ops = operability if operability is not None else Operability(port=None)
        self._stats = CommitStats(lag=self._lag)
        self._owners: dict[int, PartitionOwner] = {}
        self._owner_tasks: dict[PartitionOwner, asyncio.Task[None]] = {}
        self._backoffs: dict[int, RestartBackoff] = {}
        self._owner_factory = owner_factory
        self._restart_backoff = restart_backoff
        self._assigned: set[int] = set()
        self._joined = False
        self._stopping = False
        self._refused: str | None = None
        self._halted = asyncio.Event()
        """Set with ``_stopping``: cuts short the waits before owners are re-created."""
        self._drain = Drain()
        self._tasks: asyncio.TaskGroup | None = None
        self._ctx: OwnerContext | None = None
        self._member: GroupMember | None = None
        self._standby: Standby | None = None
        self.inflight = InFlight(settings.runtime.max_in_flight)

    def _transaction_committed(self, seconds: float) -> None:
        """One transaction of any stream: the latency histogram and the periodic stats."""
        self._ops.metrics.observe_commit(seconds)
        self._stats.transaction(seconds)

    @property
    def ready(self) -> bool:
        """Joined the group and every assigned partition's sessions are restored."""
        return (
            self._joined
            and not self._stopping
            and all(p in self._owners and self._owners[p].restored for p in self._assigned)
        )

    @property
    def assigned(self) -> frozenset[int]:
        return frozenset(self._assigned)

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop``; after a drain, hold nothing and wait for ``stop``."""
        try:
            await self._serve(StopOrDrain(stop, self._drain))
        finally:
            self._drain.done()
        if self._refused is not None:
            raise SettingRefused(self._refused)
        if self._drain.asked and not stop.is_set():
            # Not stalled: the fetch loop ended on purpose, and a restart would join again.
            self._ops.heartbeat.rest()
            logger.info("drained: holding no partition, waiting for the stop signal")
            await stop.wait()

    async def _serve(self, stop: StopOrDrain) -> None:
        settings = self._settings
        partitions = await wait_for_topics(
            settings.kafka, settings.topics, stop, waiting=self._ops.readiness.waiting
        )
        if partitions is None:
            if self._drain.asked:
                logger.info("drained before joining the group: it is not joined")
            else:
                logger.info("stopped before joining the group")
            return
        group = settings.group
        consumer = AIOKafkaConsumer(
            **connection_options(settings.kafka),
            client_id=f"{settings.kafka.client_id}-consumer",
            group_id=group.group_id,
            group_instance_id=group.instance_id,
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            partition_assignment_strategy=(RangePartitionAssignor,),
            session_timeout_ms=group.session_timeout_ms,
            heartbeat_interval_ms=group.heartbeat_interval_ms,
            max_poll_interval_ms=group.max_poll_interval_ms,
            rebalance_timeout_ms=group.rebalance_timeout_ms,
            max_partition_fetch_bytes=4 * 1024 * 1024,
        )
        inputs = KafkaInput(consumer)
        self._member = member = KafkaGroupMember(
            consumer, group.instance_id, session_timeout_s=group.session_timeout_ms / 1000
        )
        sessions = SessionsReader(settings.kafka, settings.topics.sessions, self._ops.metrics)
        scratch = None
        root = settings.sessions.store_dir
        if root is None:
            scratch = tempfile.TemporaryDirectory(prefix="cairn-sessions-")
            root = Path(scratch.name)
        standby = None
        if settings.sessions.standby:
            standby = Standby(
                settings.kafka,
                settings.topics.sessions,
                root / group.group_id,
                max_age_s=settings.sessions.local_max_age_s,
            )
            standby.follow(range(partitions))
        self._standby = standby
        transport = KafkaTransport(
            settings.kafka,
            transaction_timeout_ms=settings.runtime.transaction_timeout_ms,
            make_producer=(
                KafkaTxnV2Producer if settings.runtime.transactions_version == 2 else None
            ),
        )
        faults = FaultPoints(settings.faults)

        def make_stream(transactional_id: str, *, shared: bool) -> TransactionStream:
            return TransactionStream(
                transport=transport,
                transactional_id=transactional_id,
                group_id=group.group_id,
                sessions_topic=settings.topics.sessions,
                membership=member.membership,
                timeout_s=settings.runtime.commit_timeout_s,
                faults=faults,
                shared=shared,
                on_transaction=self._transaction_committed,
            )

        shared: TransactionStream | None = None
        streams: Streams
        if settings.runtime.transaction_streams == "instance":
            shared = make_stream(instance_transactional_id(settings), shared=True)
            streams = InstanceStream(shared)
        else:
            streams = PartitionStreams(
                lambda p: make_stream(partition_transactional_id(group, p), shared=False)
            )
        self._ctx = OwnerContext(
            settings=settings,
            streams=streams,
            sessions=sessions,
            store_root=root / group.group_id,
            standby=standby,
            agents=self._agents,
            inputs=inputs,
            inflight=self.inflight,
            faults=faults,
            on_restored=self._restored,
            observer=self._stats,
            metrics=self._ops.metrics,
            partitions=partitions,
            cache=SessionCache(settings.sessions.cache_max_bytes),
        )
        watch = MembershipWatch(consumer, session_timeout_s=group.session_timeout_ms / 1000)
        beat = self._ops.heartbeat.beat

        def turned() -> None:
            beat()
            watch.lost()  # a sample: a lapse is dated from the first turn that sees it

        loop = ConsumerLoop(
            inputs,
            self._owners,
            self.inflight,
            max_records=settings.runtime.fetch_max_records,
            on_turn=turned,
        )
        logger.info(
            "group=<%s>, instance=<%s>, partitions=<%d>, transaction_streams=<%s>, "
            "transactional_id=<%s> | joining",
            group.group_id,
            group.instance_id,
            partitions,
            settings.runtime.transaction_streams,
            shared.transactional_id
            if shared is not None
            else f"{transactional_id_prefix(group)}<partition>",
        )
        await started(consumer)
        self._ops.readiness.membership(watch.lost)
        try:
            await transport.offsets.start()
            if shared is not None:
                try:
                    await shared.start()
                except TIMEOUT_REFUSED:
                    raise SettingRefused(self._timeout_refused()) from None
            consumer.subscribe(
                topics=[settings.topics.commands, settings.topics.control],
                listener=RebalanceListener(on_revoked=self._revoke, on_assigned=self._assign),
            )
            async with asyncio.TaskGroup() as tasks:
                self._tasks = tasks
                committing = tasks.create_task(shared.run()) if shared is not None else None
                fetching = tasks.create_task(loop.run())
                probe = tasks.create_task(self._lag.run())
                proving = tasks.create_task(
                    watch.run(member.current, group.heartbeat_interval_ms / 1000)
                )
                following = tasks.create_task(standby.run()) if standby is not None else None
                await stop.wait()
                logger.info("owners=<%d> | stopping: draining partitions", len(self._owners))
                self._begin_stopping()
                loop.stop()
                await fetching
                await self._stop_owners(set(self._owners))
                probe.cancel()
                proving.cancel()
                if committing is not None:
                    committing.cancel()
                if following is not None:
                    following.cancel()
        finally:
            self._tasks = None
            if shared is not None:
                await shared.close()
            await transport.offsets.close()
            await sessions.close()
            await stop_consumer(consumer)
            # Out of the group: nothing is held (after a drain the process lives on, probed).
            self._ops.readiness.membership(None)
            self._ops.readiness.left()
            self._assigned = set()
            if scratch is not None:
                scratch.cleanup()
            logger.info("left the group")

    async def drain(self) -> None:
        """The pre-stop hook: stop taking work, let every owned partition reach a commit and
        leave the group (or never join it), so other instances take the partitions at once;
        returns once nothing is held. :meth:`run` then waits for its stop event."""
        logger.info("owners=<%d> | drain requested: leaving the group", len(self._owners))
        self._begin_stopping()
        await self._drain.request()

    def _timeout_refused(self) -> str:
        timeout_ms = self._settings.runtime.transaction_timeout_ms
        return (
            f"the broker refuses CAIRN_RUNTIME__TRANSACTION_TIMEOUT_MS ({timeout_ms} ms): it is "
            "above the broker's transaction.max.timeout.ms (900000 ms unless set otherwise), so "
            "no transaction can start"
        )

    def _refuse(self, why: str) -> None:
        """End the instance's work as a drain does; :meth:`run` then raises ``why``."""
        if self._refused is None:
            logger.error("reason=<%s> | a setting the broker refuses: stopping", why)
            self._refused = why
        self._begin_stopping()
        self._drain.ask()

    def _begin_stopping(self) -> None:
        """No owner starts from now on, and the instance reports not ready."""
        self._stopping = True
        self._halted.set()
        self._ops.readiness.stopping()

    async def _assign(self, partitions: set[int]) -> None:
        self._joined = True
        dropped = self._assigned - partitions
        if dropped:
            self._ops.readiness.revoked(dropped)
        self._assigned = set(partitions)
        self._ops.readiness.assigned(p for p in partitions if p not in self._owners)
        if self._stopping:
            return
        logger.info("partitions=<%s> | partitions assigned", sorted(partitions))
        for partition in sorted(partitions):
            if partition not in self._owners:
                self._start_owner(partition)

    async def _revoke(self, partitions: set[int]) -> None:
        logger.info("partitions=<%s> | partitions revoked", sorted(partitions))
        self._assigned -= partitions
        self._ops.readiness.revoked(partitions)
        self._ops.readiness.rebalancing()
        await self._stop_owners(partitions)
        if self._standby is not None and not self._stopping:
            self._standby.follow(partitions)

    def _restored(self, partition: int) -> None:
        self._ops.readiness.restored(partition)
        logger.info("partition=<%d> | partition ready", partition)

    def _start_owner(self, partition: int) -> None:
        assert self._tasks is not None and self._ctx is not None
        owner = self._owner_factory(partition, self._ctx)
        self._owners[partition] = owner
        self._owner_tasks[owner] = self._tasks.create_task(self._own(owner))

    async def _own(self, owner: PartitionOwner) -> None:
        try:
            exit_ = await owner.run()
        finally:
            self._owner_tasks.pop(owner, None)
            if self._owners.get(owner.partition) is owner:
                del self._owners[owner.partition]
        partition = owner.partition
        backoff = self._backoffs.get(partition)
        if backoff is None:
            backoff = self._backoffs[partition] = self._restart_backoff()
        if owner.transactions:
            backoff.succeeded()
        if exit_ is OwnerExit.FAILED and isinstance(owner.error, TIMEOUT_REFUSED):
            self._refuse(self._timeout_refused())
        elif exit_ is OwnerExit.FAILED and not self._stopping:
            delay = backoff.failed()
            logger.warning(
                "partition=<%d>, error=<%r>, failures=<%d>, retry_in_s=<%.1f> | partition owner "
                "failed, it is re-created then if this instance is still a member of the group",
                partition,
                owner.error,
                backoff.failures,
                delay,
            )
            # Down until the fresh owner has restored: not ready in the meantime.
            self._ops.readiness.restoring(partition)
            if await self._waited(delay) and await self._still_member(partition):
                self._start_owner(partition)
        elif exit_ is OwnerExit.FENCED and not self._stopping:
            await self._recheck_fenced(partition)

    async def _recheck_fenced(self, partition: int) -> None:
        """Take a fenced partition back if the group still gives it to this instance.

        A zombie learns from its next heartbeat that it lost the partition, and the revoke
        removes the partition from the assignment. A member that still owns it after a session
        timeout and a heartbeat was fenced by something else (a transaction the broker aborted
        after ``transaction_timeout_ms``, a stray producer with the same id) and would otherwise
        leave the partition unserved until the next rebalance.
        """
        group = self._settings.group
        wait_s = (group.session_timeout_ms + group.heartbeat_interval_ms) / 1000 + 1.0
        logger.warning(
            "partition=<%d>, recheck_in_s=<%.1f> | partition owner fenced; it is re-created if "
            "this instance still owns the partition then",
            partition,
            wait_s,
        )
        self._ops.readiness.restoring(partition)
        if await self._waited(wait_s) and await self._still_member(partition):
            logger.warning(
                "partition=<%d> | still owned after being fenced: taking it back", partition
            )
            self._start_owner(partition)

    async def _waited(self, seconds: float) -> bool:
        """Wait ``seconds``; False when the instance began stopping meanwhile."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._halted.wait()
        return not self._stopping

    async def _still_member(self, partition: int) -> bool:
        """The partition is still assigned here (:meth:`_still_mine`) and the group coordinator
        answered a heartbeat sent now that the membership which assigned it is current.

        A process woken from a pause past the session timeout holds its lost assignment until
        aiokafka's next heartbeat; an owner re-created then starts the partition's producer and
        fences its new owner. A membership found over is left to the revoke that follows; with
        no answer the member is asked again a heartbeat interval later, while the partition is
        still assigned here (a rebalance under way ends in a revoke or a fresh owner).
        """
        assert self._member is not None
        retry_s = self._settings.group.heartbeat_interval_ms / 1000
        while self._still_mine(partition):
            current = await self._unless_stopped(self._member.current())
            if self._stopping:
                return False
            if current is not None:
                if not current:
                    logger.warning(
                        "partition=<%d> | group membership over: the owner is not re-created, "
                        "the partition goes with the rebalance",
                        partition,
                    )
                return current and not self._stopping and self._still_mine(partition)
            if not await self._waited(retry_s):
                return False
        return False

    async def _unless_stopped(self, asking: Coroutine[Any, Any, bool | None]) -> bool | None:
        """``asking``'s answer; None at once when the instance begins stopping meanwhile (an
        unanswered heartbeat would otherwise hold the stop up to a session timeout)."""
        answer = asyncio.ensure_future(asking)
        halted = asyncio.ensure_future(self._halted.wait())
        try:
            await asyncio.wait((answer, halted), return_when=asyncio.FIRST_COMPLETED)
        finally:
            discard((answer, halted))
        return answer.result() if answer.done() and not answer.cancelled() else None

    def _still_mine(self, partition: int) -> bool:
        """Assigned here and nobody (a rebalance's fresh owner) serves it yet."""
        return partition in self._assigned and partition not in self._owners

    async def _stop_owners(self, partitions: set[int]) -> None:
        grace = self._settings.runtime.revoke_grace_s
        owners = [self._owners.pop(p) for p in sorted(partitions) if p in self._owners]
        for owner in owners:
            owner.request_stop(grace)
        tasks = [self._owner_tasks[o] for o in owners if o in self._owner_tasks]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=grace + _STOP_MARGIN_S)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
