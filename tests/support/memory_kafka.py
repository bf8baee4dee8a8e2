"""An in-memory Kafka for the runtime's unit tests: the :class:`Transport` the transaction stream
uses and the :class:`Changelog` a restore reads, with the broker's rules they rest on, and a
failure injectable at every call.

What it models: logs of records per partition, each record committed, aborted or still open in
its producer's transaction; transactional ids with a producer epoch (InitProducerId aborts what
the previous epoch left open and fences it); a consumer group with a generation and members, and
its committed offsets with their metadata, which a transaction's offset commit only moves when
the transaction commits, and which are unstable while one is open; records the broker refuses
for good (a topic whose records are too large). What it does not: partitions added to a
transaction one by one, markers written late, timeouts on the broker's side.
"""

from __future__ import annotations

import asyncio
import zlib
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from aiokafka import TopicPartition
from aiokafka.errors import MessageSizeTooLargeError, ProducerFenced
from aiokafka.structs import OffsetAndMetadata

from service.runtime.offset_fetch import UNSTABLE_OFFSET_COMMIT
from service.runtime.restore import ChangelogRecord
from service.runtime.transport import Delivery, GroupFencedError, TxnProducer
from service.runtime.txn_offset_commit import Membership
from service.runtime.work import OutRecord
from service.sessions.store import event_seq_header

CALLS = ("start", "begin", "send", "delivery", "offsets", "commit", "abort", "fetch")
"""Every call a failure can be injected at (``delivery``: the broker refuses a sent batch)."""


@dataclass
class Entry:
    record: OutRecord
    producer: str
    state: str = "open"
    """open, committed or aborted."""


@dataclass
class Txn:
    epoch: int
    entries: list[Entry] = field(default_factory=list)
    offsets: dict[TopicPartition, OffsetAndMetadata] = field(default_factory=dict)


class MemoryKafka:
    def __init__(self, partitions: int = 4) -> None:
        self.partitions = partitions
        self.logs: dict[tuple[str, int], list[Entry]] = defaultdict(list)
        self.epochs: dict[str, int] = {}
        self.open: dict[str, Txn] = {}
        self.generation = 1
        self.members = {"member-1"}
        self.committed: dict[TopicPartition, tuple[int, str]] = {}
        self.too_large: set[str] = set()
        """Topics whose every record the broker refuses for good."""
        self.calls: list[tuple[str, str]] = []
        """(transactional id or ``group``, call) in the order they were made."""
        self._failures: dict[str, list[BaseException]] = defaultdict(list)
        self._hangs: dict[str, asyncio.Event] = {}
        self.offsets = MemoryGroupOffsets(self)

    # the transport
    def producer(self, transactional_id: str) -> TxnProducer:
        return MemoryProducer(self, transactional_id)

    # what a test arranges
    def fail(self, call: str, error: BaseException, times: int = 1) -> None:
        """The next ``times`` calls of ``call`` raise ``error``."""
        assert call in CALLS, call
        self._failures[call].extend([error] * times)

    def hang(self, call: str) -> asyncio.Event:
        """The next call of ``call`` waits until the returned event is set."""
        assert call in CALLS, call
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

    def open_entries(self) -> int:
        return sum(1 for entries in self.logs.values() for e in entries if e.state == "open")

    # the broker's side
    async def enter(self, owner: str, call: str) -> None:
        self.calls.append((owner, call))
        gate = self._hangs.pop(call, None)
        if gate is not None:
            await gate.wait()
        failures = self._failures.get(call)
        if failures:
            raise failures.pop(0)

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
        if txn is not None:
            self._end(txn, committed=committed)

    def _end(self, txn: Txn, *, committed: bool) -> None:
        for entry in txn.entries:
            entry.state = "committed" if committed else "aborted"
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
        self.kafka.open[self.transactional_id] = Txn(self.epoch)

    async def partition_of(self, topic: str, key: bytes | None) -> int:
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
        delivered.set_result(len(log))
        for record in records:
            entry = Entry(record, self.transactional_id)
            log.append(entry)
            txn.entries.append(entry)
        return [(delivered, len(records))]

    async def commit_offsets(
        self,
        group_id: str,
        membership: Membership,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
    ) -> None:
        kafka = self.kafka
        await kafka.enter(self.transactional_id, "offsets")
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
        pending = {tp for txn in kafka.open.values() for tp in txn.offsets}
        found = {}
        for tp in partitions:
            if require_stable and tp in pending:
                found[tp] = (-1, "", UNSTABLE_OFFSET_COMMIT)
            else:
                offset, metadata = kafka.committed.get(tp, (-1, ""))
                found[tp] = (offset, metadata, 0)
        return found


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
