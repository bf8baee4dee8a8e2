"""An in-memory Kafka for the runtime's unit tests: the :class:`Transport` the transaction stream
uses, the :class:`InputSource` the consumer loop and the partition owners fetch from, the
:class:`Sessions` an owner restores from, and the :class:`Changelog` a restore reads, with the
broker's rules they rest on, and a failure injectable at every call.

Every injected failure that fires is recorded in :data:`INJECTED` with the test module it fired
in, so a module can prove that its tests failed each call of the protocols it covers
(:func:`assert_every_call_failed`): a protocol call without an injection point here, or without
a test injecting a failure at it, fails that proof.

What it models: logs of records per partition, each record committed, aborted or still open in
its producer's transaction; transactional ids with a producer epoch (InitProducerId aborts what
the previous epoch left open and fences it); a consumer group with a generation and members, and
its committed offsets with their metadata, which a transaction's offset commit only moves when
the transaction commits, and which are unstable while one is open; a member of the group that
keeps the membership it joined with until a heartbeat tells it the group moved on; markers per
producer id (an ABORT or COMMIT marker ends every batch its transactional id left open on the
partition); records the broker refuses for good (a topic whose records are too large);
read_committed readers that stop at a partition's first open batch. What it does not:
partitions added to a transaction one by one, markers written late, timeouts on the broker's
side, fetch sessions.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
import zlib
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import IllegalStateError, MessageSizeTooLargeError, ProducerFenced
from aiokafka.structs import OffsetAndMetadata

from service.runtime.offset_fetch import UNSTABLE_OFFSET_COMMIT
from service.runtime.restore import ChangelogRecord, catch_up
from service.runtime.transport import Delivery, GroupFencedError, GroupOffsets, TxnProducer
from service.runtime.txn_offset_commit import Membership
from service.runtime.work import InputRecord, Origin, OutRecord
from service.sessions import history
from service.sessions.cache import SessionCache
from service.sessions.store import SessionStore, event_seq_header
from service.sessions.table import Table

CALLS = (
    "start",
    "begin",
    "partition_of",
    "send",
    "delivery",
    "add_group",
    "offsets",
    "commit",
    "abort",
    "fetch",
    "heartbeat",
)
"""Every call of the transport a failure can be injected at (``delivery``: the broker refuses a
sent batch; ``fetch``: the group's offsets; ``heartbeat``: a group member's question whether its
membership is current)."""
INPUT_CALLS = (
    "input.fetch",
    "input.assignment",
    "input.paused",
    "input.pause",
    "input.resume",
    "input.seek",
    "input.beginning_offsets",
)
SESSIONS_CALLS = (
    "sessions.restore",
    "sessions.stable_and_end",
    "sessions.read_open",
    "sessions.partition_for",
    "sessions.partition_count",
    "sessions.topic_id",
    "sessions.committed_tail",
    "sessions.session_records",
)
CHANGELOG_CALLS = ("bounds", "batch")

INJECTION_POINTS: dict[str, tuple[str, ...]] = {
    "TxnProducer.start": ("start",),
    "TxnProducer.begin": ("begin",),
    "TxnProducer.partition_of": ("partition_of",),
    "TxnProducer.send": ("send", "delivery"),
    "TxnProducer.add_group": ("add_group",),
    "TxnProducer.commit_offsets": ("offsets",),
    "TxnProducer.commit": ("commit",),
    "TxnProducer.abort": ("abort",),
    "GroupOffsets.fetch": ("fetch",),
    "GroupMember.current": ("heartbeat",),
    **{f"InputSource.{call.removeprefix('input.')}": (call,) for call in INPUT_CALLS},
    **{f"Sessions.{call.removeprefix('sessions.')}": (call,) for call in SESSIONS_CALLS},
    "Changelog.bounds": ("bounds",),
    "Changelog.read": ("batch",),
}
"""Where the in-memory Kafka injects a failure for each call of the runtime's Kafka protocols."""
NO_FAILURE: dict[str, str] = {
    "TxnProducer.close": "never raises (a bounded stop; what it leaves open, fencing ends)",
    "GroupOffsets.start": "called by the runtime once before it joins; a failure stops it",
    "GroupOffsets.close": "called by the runtime as it ends, errors suppressed",
    "Transport.producer": "makes a producer object, no I/O",
    "GroupMember.membership": "reads the member's own state, no I/O",
    "InputSource.fetched_at": "reads the member's own state, no I/O",
}
"""Protocol calls with no failure to inject, and why."""

INJECTED: set[tuple[str, str]] = set()
"""(test module file, call) of every injected failure that fired."""


def _injected(call: str) -> None:
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    INJECTED.add((current.split("::", 1)[0], call))


def protocol_calls(*protocols: type) -> list[str]:
    """``Protocol.method`` of every public method the protocols declare."""
    return [
        f"{protocol.__name__}.{name}"
        for protocol in protocols
        for name, member in vars(protocol).items()
        if not name.startswith("_") and inspect.isfunction(member)
    ]


def assert_every_call_failed(
    request: pytest.FixtureRequest, *protocols: type, elsewhere: Mapping[str, str] | None = None
) -> None:
    """Every call of ``protocols`` had an injected failure fire in this test module's tests,
    but those ``elsewhere`` names (call: the module that covers it, as the component under test
    never makes it).

    Run as the module's last test: it skips when the module's other tests did not all run
    before it (a selection of them), since it proves what they did."""
    module = request.module
    defined = {name for name, value in vars(module).items() if name.startswith("test_")}
    collected = [item for item in request.session.items if getattr(item, "module", None) is module]
    names = {getattr(item, "originalname", item.name) for item in collected}
    if names != defined or collected[-1] is not request.node:
        pytest.skip("proves what the whole module's tests did: run the whole module")
    path = request.node.nodeid.split("::", 1)[0]
    fired = {call for where, call in INJECTED if where == path}
    missing: list[str] = []
    for name in protocol_calls(*protocols):
        if name in NO_FAILURE or name in (elsewhere or {}):
            continue
        points = INJECTION_POINTS.get(name)
        assert points is not None, f"{name} has no failure injection point in memory_kafka"
        missing.extend(f"{name} ({point})" for point in points if point not in fired)
    assert not missing, f"no test of this module injected a failure at: {missing}"


@dataclass
class Entry:
    record: OutRecord
    producer: str
    state: str = "open"
    """open, committed or aborted."""
    unreadable: str | None = None
    """Why the consumer could not read it (``InputRecord.unreadable``)."""


@dataclass
class Txn:
    transactional_id: str
    epoch: int
    entries: list[Entry] = field(default_factory=list)
    partitions: set[tuple[str, int]] = field(default_factory=set)
    offsets: dict[TopicPartition, OffsetAndMetadata] = field(default_factory=dict)
    group: bool = False
    """The group's offsets partition is in the transaction (its markers go there too)."""


class MemoryKafka:
    def __init__(self, partitions: int = 4) -> None:
        self.partitions = partitions
        self.logs: dict[tuple[str, int], list[Entry]] = defaultdict(list)
        self.epochs: dict[str, int] = {}
        self.open: dict[str, Txn] = {}
        self.generation = 1
        self.members = {"member-1"}
        self.committed: dict[TopicPartition, tuple[int, str]] = {}
        self.pending: dict[str, dict[TopicPartition, OffsetAndMetadata]] = {}
        """Offsets a producer id left pending with no transaction to end them (lost markers):
        only a marker of that producer id on the group's offsets partition ends them."""
        self.too_large: set[str] = set()
        """Topics whose every record the broker refuses for good."""
        self.topic_ids: dict[str, str] = {}
        """Each topic's id, as Metadata version 12 gives it (none: a broker without ids)."""
        self.calls: list[tuple[str, str]] = []
        """(transactional id or ``group``, call) in the order they were made."""
        self._failures: dict[str, dict[int, BaseException]] = defaultdict(dict)
        self._counts: dict[str, int] = defaultdict(int)
        self._hangs: dict[str, asyncio.Event] = {}
        self.fired: list[tuple[int, str]] = []
        """(position in ``calls``, call) of every injected failure that fired."""
        self.offsets: GroupOffsets = MemoryGroupOffsets(self)
        self.markers_lost_on: tuple[str, int] | None = None
        self.offsets_left_out = 0
        """Fetches of the group's offsets still to answer no partition at all (what the reader
        once made of a coordinator's group-level error right after a broker restart)."""

    # the transport
    def producer(self, transactional_id: str) -> TxnProducer:
        return MemoryProducer(self, transactional_id)

    # what a test arranges
    def fail(self, call: str, error: BaseException, times: int = 1, *, after: int = 0) -> None:
        """``times`` calls of ``call`` raise ``error``, once ``after`` more went through."""
        assert call in CALLS + INPUT_CALLS + SESSIONS_CALLS, call
        first = self._counts[call] + after + 1
        for number in range(first, first + times):
            self._failures[call][number] = error

    def hang(self, call: str) -> asyncio.Event:
        """The next call of ``call`` waits until the returned event is set."""
        assert call in CALLS + INPUT_CALLS + SESSIONS_CALLS, call
        gate = self._hangs[call] = asyncio.Event()
        return gate

    def membership(self) -> Membership:
        return Membership(self.generation, sorted(self.members)[0])

    def rebalance(self) -> None:
        """A new generation with new members: every earlier membership is stale."""
        self.generation += 1
        self.members = {f"member-{self.generation}"}

    # what a test observes
    def visible(self, topic: str, partition: int | None = None) -> list[bytes | None]:
        """Values a read_committed reader gets, in log order."""
        return [
            entry.record.value
            for (name, number), entries in sorted(self.logs.items())
            if name == topic and (partition is None or number == partition)
            for entry in entries
            if entry.state == "committed"
        ]

    def lose_markers(self, transactional_id: str) -> None:
        """The coordinator completes the open transaction of ``transactional_id`` and its
        markers are lost (a broker restart): its batches stay open and its offsets pending,
        and no InitProducerId ends them any more."""
        txn = self.open.pop(transactional_id)
        self.pending.setdefault(transactional_id, {}).update(txn.offsets)

    def lose_markers_on(self, topic: str, partition: int) -> None:
        """The next transaction committed with records on ``topic``-``partition`` loses its marker
        there only (a broker restart, KAFKA-20734): its batch there stays open, every other
        partition of it, and the group's offsets, commit."""
        self.markers_lost_on = (topic, partition)

    def open_entries(self) -> int:
        return sum(1 for entries in self.logs.values() for e in entries if e.state == "open")

    # the broker's side
    def append(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]] = (),
        *,
        unreadable: str | None = None,
    ) -> int:
        """A record a client produced without a transaction (a command); returns its offset.
        ``unreadable``: one the consumer cannot read, for that reason."""
        log = self.logs[(topic, partition)]
        record = OutRecord(topic, key, value, list(headers), partition)
        log.append(Entry(record, "client", "committed", unreadable))
        return len(log) - 1

    def stable_end(self, topic: str, partition: int) -> int:
        """The last stable offset: where read_committed readers stop (the first open batch)."""
        log = self.logs[(topic, partition)]
        for offset, entry in enumerate(log):
            if entry.state == "open":
                return offset
        return len(log)

    async def enter(self, owner: str, call: str) -> None:
        gate = self._hangs.pop(call, None)
        if gate is not None:
            self.calls.append((owner, call))
            await gate.wait()
            self._count(call)
            return
        self.enter_now(owner, call)

    def enter_now(self, owner: str, call: str) -> None:
        """A call that cannot hang (one that changes only the client's state)."""
        self.calls.append((owner, call))
        self._count(call)

    def _count(self, call: str) -> None:
        self._counts[call] += 1
        error = self._failures[call].pop(self._counts[call], None)
        if error is not None:
            self.fired.append((len(self.calls) - 1, call))
            _injected(call)
            raise error

    def init_producer(self, transactional_id: str) -> int:
        txn = self.open.pop(transactional_id, None)
        if txn is not None:
            self._end(txn, committed=False)
        epoch = self.epochs.get(transactional_id, -1) + 1
        self.epochs[transactional_id] = epoch
        return epoch

    def check_epoch(self, transactional_id: str, epoch: int) -> None:
        if self.epochs.get(transactional_id) != epoch:
            raise ProducerFenced()

    def end(self, transactional_id: str, epoch: int, *, committed: bool) -> None:
        self.check_epoch(transactional_id, epoch)
        txn = self.open.pop(transactional_id, None)
        if txn is None:
            return
        lost = self.markers_lost_on
        if committed and lost in txn.partitions:
            self.markers_lost_on = None
            txn.partitions.discard(lost)
            there = {id(entry) for entry in self.logs[lost]}
            txn.entries = [entry for entry in txn.entries if id(entry) not in there]
        self._end(txn, committed=committed)

    def _end(self, txn: Txn, *, committed: bool) -> None:
        state = "committed" if committed else "aborted"
        if txn.group:
            # The marker on the group's offsets partition ends what this producer id left there.
            left = self.pending.pop(txn.transactional_id, {})
            if committed:
                txn.offsets = {**left, **txn.offsets}
        for entry in txn.entries:
            entry.state = state
        producers = {entry.producer for entry in txn.entries}
        for key in txn.partitions:
            for entry in self.logs[key]:
                if entry.state == "open" and entry.producer in producers:
                    entry.state = state
        if committed:
            for tp, offset in txn.offsets.items():
                self.committed[tp] = (offset.offset, offset.metadata)


class MemoryProducer:
    def __init__(self, kafka: MemoryKafka, transactional_id: str) -> None:
        self.kafka = kafka
        self.transactional_id = transactional_id
        self.epoch = -1

    async def start(self) -> None:
        await self.kafka.enter(self.transactional_id, "start")
        self.epoch = self.kafka.init_producer(self.transactional_id)

    async def close(self) -> None:
        """Leaves an open transaction open, as a producer that stops without EndTxn does."""

    async def begin(self) -> None:
        await self.kafka.enter(self.transactional_id, "begin")
        self.kafka.check_epoch(self.transactional_id, self.epoch)
        assert self.transactional_id not in self.kafka.open, "a transaction is already open"
        self.kafka.open[self.transactional_id] = Txn(self.transactional_id, self.epoch)

    async def partition_of(self, topic: str, key: bytes | None) -> int:
        await self.kafka.enter(self.transactional_id, "partition_of")
        return zlib.crc32(key or b"") % self.kafka.partitions

    async def send(
        self, topic: str, partition: int, records: Sequence[OutRecord]
    ) -> list[Delivery]:
        kafka = self.kafka
        await kafka.enter(self.transactional_id, "send")
        kafka.check_epoch(self.transactional_id, self.epoch)
        txn = kafka.open[self.transactional_id]
        delivered: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        try:
            await kafka.enter(self.transactional_id, "delivery")
        except BaseException as error:
            delivered.set_exception(error)
            return [(delivered, len(records))]
        if topic in kafka.too_large:
            delivered.set_exception(MessageSizeTooLargeError())
            return [(delivered, len(records))]
        log = kafka.logs[(topic, partition)]
        txn.partitions.add((topic, partition))
        delivered.set_result(len(log))
        for record in records:
            entry = Entry(record, self.transactional_id)
            log.append(entry)
            txn.entries.append(entry)
        return [(delivered, len(records))]

    async def add_group(self, group_id: str) -> None:
        kafka = self.kafka
        await kafka.enter(self.transactional_id, "add_group")
        kafka.check_epoch(self.transactional_id, self.epoch)
        kafka.open[self.transactional_id].group = True

    async def commit_offsets(
        self,
        group_id: str,
        membership: Membership,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
    ) -> None:
        kafka = self.kafka
        await kafka.enter(self.transactional_id, "offsets")
        kafka.open[self.transactional_id].group = True
        kafka.check_epoch(self.transactional_id, self.epoch)
        if membership.generation_id != kafka.generation:
            raise GroupFencedError("ILLEGAL_GENERATION")
        if membership.member_id not in kafka.members:
            raise GroupFencedError("UNKNOWN_MEMBER_ID")
        kafka.open[self.transactional_id].offsets.update(offsets)

    async def commit(self) -> None:
        await self.kafka.enter(self.transactional_id, "commit")
        self.kafka.end(self.transactional_id, self.epoch, committed=True)

    async def abort(self) -> None:
        await self.kafka.enter(self.transactional_id, "abort")
        self.kafka.end(self.transactional_id, self.epoch, committed=False)


class MemoryGroupOffsets:
    def __init__(self, kafka: MemoryKafka) -> None:
        self.kafka = kafka

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def fetch(
        self, group_id: str, partitions: Iterable[TopicPartition], *, require_stable: bool
    ) -> dict[TopicPartition, tuple[int, str, int]]:
        kafka = self.kafka
        await kafka.enter("group", "fetch")
        if kafka.offsets_left_out:
            kafka.offsets_left_out -= 1
            return {}
        pending = {tp for txn in kafka.open.values() for tp in txn.offsets}
        pending.update(tp for left in kafka.pending.values() for tp in left)
        found = {}
        for tp in partitions:
            if require_stable and tp in pending:
                found[tp] = (-1, "", UNSTABLE_OFFSET_COMMIT)
            else:
                offset, metadata = kafka.committed.get(tp, (-1, ""))
                found[tp] = (offset, metadata, 0)
        return found


class MemoryMember:
    """An instance's member of the in-memory group: the membership it joined with, kept as it
    is when the group moves on (:meth:`MemoryKafka.rebalance`); only a heartbeat finds it over."""

    def __init__(self, kafka: MemoryKafka) -> None:
        self.kafka = kafka
        self.joined = kafka.membership()

    def membership(self) -> Membership | None:
        return self.joined

    async def current(self) -> bool | None:
        """None when an injected failure makes the heartbeat go unanswered."""
        kafka = self.kafka
        try:
            await kafka.enter("group", "heartbeat")
        except Exception:  # no answer, as the broker's member reports a failed request
            return None
        joined = self.joined
        return joined.generation_id == kafka.generation and joined.member_id in kafka.members


class MemoryChangelog:
    """A compacted topic's partitions for the restore: committed records with their offsets, a
    first offset that retention may have moved, and a failure injectable at every call."""

    def __init__(self) -> None:
        self.records: dict[TopicPartition, list[ChangelogRecord]] = defaultdict(list)
        self.start: dict[TopicPartition, int] = defaultdict(int)
        self.end: dict[TopicPartition, int] = defaultdict(int)
        self.batch = 2
        """Records per batch a read yields."""
        self._failures: dict[str, dict[int, BaseException]] = defaultdict(dict)
        self._calls: dict[str, int] = defaultdict(int)
        self.reads: list[tuple[int, int]] = []

    def append(self, tp: TopicPartition, key: bytes, value: bytes | None, seq: int = 0) -> None:
        """A committed record (its event sequence number in the head's header)."""
        offset = self.end[tp]
        headers = [event_seq_header(seq)] if seq else []
        self.records[tp].append(ChangelogRecord(offset, key, value, headers, 1_000 + offset))
        self.end[tp] = offset + 1

    def marker(self, tp: TopicPartition) -> None:
        """A transaction marker: an offset no reader ever gets as a record."""
        self.end[tp] += 1

    def fail(self, call: str, error: BaseException, *, after: int = 0) -> None:
        """``bounds`` or ``batch`` (one batch of a read) raises ``error`` once ``after`` more
        calls of it went through."""
        assert call in ("bounds", "batch"), call
        self._failures[call][self._calls[call] + after + 1] = error

    def _enter(self, call: str) -> None:
        self._calls[call] += 1
        error = self._failures[call].pop(self._calls[call], None)
        if error is not None:
            _injected(call)
            raise error

    async def bounds(self, tp: TopicPartition) -> tuple[int, int]:
        self._enter("bounds")
        return self.start[tp], self.end[tp]

    async def read(
        self, tp: TopicPartition, start: int, end: int
    ) -> AsyncIterator[list[ChangelogRecord]]:
        self.reads.append((start, end))
        first_kept = self.start[tp]
        wanted = [r for r in self.records[tp] if max(start, first_kept) <= r.offset < end]
        for first in range(0, len(wanted), self.batch):
            self._enter("batch")
            yield wanted[first : first + self.batch]


_IDLE_FETCH_S = 0.002
"""How long an empty fetch waits (a broker's long poll, shortened for the unit tests)."""


class MemoryInput:
    """The group consumer of the input topics over the in-memory logs: an assignment, a
    position per partition (the committed offset on assignment, else the log's start), pause
    and resume, seek; a fetch returns each unpaused partition's committed records from its
    position up to its first open batch (read_committed), skipping aborted ones. Pausing,
    resuming or seeking a partition not assigned raises, as aiokafka does."""

    def __init__(self, kafka: MemoryKafka) -> None:
        self.kafka = kafka
        self.positions: dict[TopicPartition, int] = {}
        self._assigned: set[TopicPartition] = set()
        self._paused: set[TopicPartition] = set()
        self.withheld: set[TopicPartition] = set()
        """Partitions a fetch leaves out for now, as if their broker answered late (the
        runtime does not know: they are neither paused nor empty to it)."""
        self.fetches = 0
        self.fetched_while_paused = 0
        self.answered_ms: dict[TopicPartition, int] = {}
        """When a fetch last answered each partition (epoch ms), as aiokafka stamps it."""

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """What a rebalance gives this member."""
        self._assigned = set(partitions)
        self._paused &= self._assigned
        self.answered_ms.clear()  # a new assignment starts unstamped, as aiokafka's does
        for tp in self._assigned:
            committed = self.kafka.committed.get(tp)
            self.positions[tp] = committed[0] if committed else 0

    async def fetch(
        self, timeout_ms: int, max_records: int
    ) -> dict[TopicPartition, list[InputRecord]]:
        await self.kafka.enter("input", "input.fetch")
        self.fetches += 1
        now_ms = int(time.time() * 1000)
        for tp in self._assigned - self._paused:
            self.answered_ms[tp] = now_ms
        if self._paused:
            self.fetched_while_paused += 1
        batches = self._take(max_records)
        if not batches:
            await asyncio.sleep(min(timeout_ms / 1000, _IDLE_FETCH_S))
        return batches

    def _take(self, max_records: int) -> dict[TopicPartition, list[InputRecord]]:
        batches: dict[TopicPartition, list[InputRecord]] = {}
        room = max_records
        for tp in sorted(self._assigned - self._paused - self.withheld):
            log = self.kafka.logs[(tp.topic, tp.partition)]
            end = self.kafka.stable_end(tp.topic, tp.partition)
            offset = self.positions[tp]
            taken: list[InputRecord] = []
            while offset < end and room:
                entry = log[offset]
                if entry.state == "committed":
                    record = entry.record
                    origin = Origin(tp.topic, tp.partition, offset)
                    headers = list(record.headers)
                    taken.append(
                        InputRecord(
                            origin, record.key, record.value, headers, offset, entry.unreadable
                        )
                    )
                    room -= 1
                offset += 1
            self.positions[tp] = offset
            if taken:
                batches[tp] = taken
        return batches

    def assignment(self) -> set[TopicPartition]:
        self.kafka.enter_now("input", "input.assignment")
        return set(self._assigned)

    def fetched_at(self, tp: TopicPartition) -> int | None:
        return self.answered_ms.get(tp) if tp in self._assigned else None

    def paused(self) -> set[TopicPartition]:
        self.kafka.enter_now("input", "input.paused")
        return set(self._paused)

    def pause(self, *partitions: TopicPartition) -> None:
        self.kafka.enter_now("input", "input.pause")
        self._paused |= set(self._assigned_only(partitions))

    def resume(self, *partitions: TopicPartition) -> None:
        self.kafka.enter_now("input", "input.resume")
        self._paused -= set(self._assigned_only(partitions))

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.kafka.enter_now("input", "input.seek")
        self.positions[self._assigned_only([tp])[0]] = offset

    async def beginning_offsets(
        self, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, int]:
        await self.kafka.enter("input", "input.beginning_offsets")
        return dict.fromkeys(partitions, 0)

    def _assigned_only(self, partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
        partitions = list(partitions)
        for tp in partitions:
            if tp not in self._assigned:
                raise IllegalStateError(f"no current assignment for partition {tp}")
        return partitions


class MemorySessions:
    """The owner's reader of the sessions topic over the in-memory logs: a restore reads the
    committed records of the partition's sessions log (through :func:`catch_up`), and the
    partitions written are looked at read_committed and read_uncommitted."""

    def __init__(self, kafka: MemoryKafka, topic: str) -> None:
        self.kafka = kafka
        self.topic = topic
        self.restores: list[int] = []

    async def restore(self, partition: int, table: Table, *, cache: SessionCache) -> SessionStore:
        await self.kafka.enter("sessions", "sessions.restore")
        await catch_up(_LogChangelog(self.kafka), self.topic, partition, table)
        self.restores.append(partition)
        return SessionStore(table, cache=cache)

    async def stable_and_end(
        self, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, tuple[int, int]]:
        await self.kafka.enter("sessions", "sessions.stable_and_end")
        return {
            tp: (
                self.kafka.stable_end(tp.topic, tp.partition),
                len(self.kafka.logs[(tp.topic, tp.partition)]),
            )
            for tp in partitions
        }

    async def read_open(self, tp: TopicPartition, start: int, end: int) -> list[OutRecord]:
        await self.kafka.enter("sessions", "sessions.read_open")
        return [
            OutRecord(tp.topic, e.record.key, e.record.value, list(e.record.headers), tp.partition)
            for e in self.kafka.logs[(tp.topic, tp.partition)][start:end]
        ]

    async def partition_for(self, topic: str, session_id: str) -> int:
        await self.kafka.enter("sessions", "sessions.partition_for")
        return zlib.crc32(session_id.encode()) % self.kafka.partitions

    async def partition_count(self, topic: str) -> int:
        await self.kafka.enter("sessions", "sessions.partition_count")
        return self.kafka.partitions

    async def topic_id(self, topic: str) -> str | None:
        await self.kafka.enter("sessions", "sessions.topic_id")
        return self.kafka.topic_ids.get(topic)

    async def committed_tail(self, tp: TopicPartition, offsets: int) -> list[OutRecord]:
        await self.kafka.enter("sessions", "sessions.committed_tail")
        stable = self.kafka.stable_end(tp.topic, tp.partition)
        return [
            OutRecord(tp.topic, e.record.key, e.record.value, list(e.record.headers), tp.partition)
            for e in self.kafka.logs[(tp.topic, tp.partition)][max(0, stable - offsets) : stable]
            if e.state == "committed"
        ]

    async def session_records(self, session_id: str) -> dict[bytes, bytes]:
        await self.kafka.enter("sessions", "sessions.session_records")
        head, mine = session_id.encode(), history.prefix(session_id)
        found: dict[bytes, bytes] = {}
        for (topic, _), log in self.kafka.logs.items():
            if topic != self.topic:
                continue
            for entry in log:
                key, value = entry.record.key, entry.record.value
                if entry.state != "committed" or key is None:
                    continue
                if key == head or key.startswith(mine):
                    if value is None:
                        found.pop(key, None)
                    else:
                        found[key] = value
        return found


class _LogChangelog:
    def __init__(self, kafka: MemoryKafka) -> None:
        self.kafka = kafka

    async def bounds(self, tp: TopicPartition) -> tuple[int, int]:
        return 0, self.kafka.stable_end(tp.topic, tp.partition)

    async def read(
        self, tp: TopicPartition, start: int, end: int
    ) -> AsyncIterator[list[ChangelogRecord]]:
        log = self.kafka.logs[(tp.topic, tp.partition)]
        found = [
            ChangelogRecord(offset, e.record.key, e.record.value, list(e.record.headers), offset)
            for offset, e in enumerate(log[start:end], start)
            if e.state == "committed"
        ]
        if found:
            yield found
