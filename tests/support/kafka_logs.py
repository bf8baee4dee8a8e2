"""Readers of a local broker's files, to explain an open transaction after the fact: the record
batches of a partition (producer id, epoch, markers) and the transaction coordinator's log.

Guarantee: read-only, safe while the broker runs; a batch still being written at the end of the
active segment is left out. Transactions are matched to markers the way the partition leader
does it: a marker ends every open batch of its producer id, whatever their epoch.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from aiokafka.record.memory_records import MemoryRecords

TRANSACTION_STATE_TOPIC = "__transaction_state"
TXN_STATES = {
    0: "Empty",
    1: "Ongoing",
    2: "PrepareCommit",
    3: "PrepareAbort",
    4: "CompleteCommit",
    5: "CompleteAbort",
    6: "Dead",
    7: "PrepareEpochFence",
}
_MARKERS = {0: "ABORT", 1: "COMMIT"}


@dataclass(frozen=True)
class Batch:
    base_offset: int
    last_offset: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool
    marker: str | None
    """``COMMIT`` or ``ABORT`` for a control batch, else None."""
    records: int

    def __str__(self) -> str:
        kind = self.marker or ("txn data" if self.transactional else "data")
        return (
            f"offsets {self.base_offset}-{self.last_offset} {kind} pid={self.producer_id} "
            f"epoch={self.producer_epoch} seq={self.base_sequence}"
        )


@dataclass(frozen=True)
class TxnLogEntry:
    """One state of a transactional id as the coordinator wrote it down (None: a tombstone)."""

    offset: int
    transactional_id: str
    producer_id: int | None
    producer_epoch: int | None
    state: str | None
    partitions: tuple[str, ...]
    last_update_ms: int | None

    def __str__(self) -> str:
        if self.state is None:
            return f"@{self.offset} {self.transactional_id} tombstone"
        return (
            f"@{self.offset} {self.transactional_id} pid={self.producer_id} "
            f"epoch={self.producer_epoch} {self.state} partitions={list(self.partitions)} "
            f"updated_ms={self.last_update_ms}"
        )


def _segments(log_dir: Path, topic: str, partition: int) -> list[Path]:
    return sorted((log_dir / f"{topic}-{partition}").glob("*.log"))


def _batches_of(path: Path) -> Iterator[object]:
    records = MemoryRecords(path.read_bytes())
    while True:
        batch = records.next_batch()
        if batch is None:
            return
        yield batch


def partition_batches(log_dir: Path, topic: str, partition: int) -> list[Batch]:
    """Every complete record batch of the partition, in log order."""
    found = []
    for segment in _segments(log_dir, topic, partition):
        for raw in _batches_of(segment):
            marker = None
            records = list(raw)  # type: ignore[call-overload]
            if raw.is_control_batch:  # type: ignore[attr-defined]
                marker = _MARKERS.get(struct.unpack(">hh", records[0].key[:4])[1], "?")
            found.append(
                Batch(
                    base_offset=raw.base_offset,  # type: ignore[attr-defined]
                    last_offset=raw.next_offset - 1,  # type: ignore[attr-defined]
                    producer_id=raw.producer_id,  # type: ignore[attr-defined]
                    producer_epoch=raw.producer_epoch,  # type: ignore[attr-defined]
                    base_sequence=raw.base_sequence,  # type: ignore[attr-defined]
                    transactional=raw.is_transactional,  # type: ignore[attr-defined]
                    marker=marker,
                    records=len(records),
                )
            )
    return found


def open_batches(batches: list[Batch]) -> list[Batch]:
    """Transactional batches that no later marker of their producer id ends."""
    open_by_producer: dict[int, list[Batch]] = {}
    for batch in batches:
        if batch.marker is not None:
            open_by_producer.pop(batch.producer_id, None)
        elif batch.transactional:
            open_by_producer.setdefault(batch.producer_id, []).append(batch)
    return sorted(
        (batch for group in open_by_producer.values() for batch in group),
        key=lambda batch: batch.base_offset,
    )


def late_markers(batches: list[Batch]) -> list[tuple[Batch, list[Batch]]]:
    """Markers that ended more than one batch of their producer id, or a batch of an earlier
    epoch, with those batches. For a writer that puts one batch on a partition per transaction
    (Cairn's committer does), each is a transaction whose own marker never came."""
    found = []
    open_by_producer: dict[int, list[Batch]] = {}
    for batch in batches:
        if batch.marker is not None:
            ended = open_by_producer.pop(batch.producer_id, [])
            epochs = {e.producer_epoch for e in ended}
            if len(ended) > 1 or epochs - {batch.producer_epoch}:
                found.append((batch, ended))
        elif batch.transactional:
            open_by_producer.setdefault(batch.producer_id, []).append(batch)
    return found


class _Reader:
    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def _take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self._data, self._pos)
        self._pos += struct.calcsize(fmt)
        return int(value)

    def int8(self) -> int:
        return self._take(">b")

    def int16(self) -> int:
        return self._take(">h")

    def int32(self) -> int:
        return self._take(">i")

    def int64(self) -> int:
        return self._take(">q")

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            byte = self._data[self._pos]
            self._pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def string(self, compact: bool) -> str:
        length = self.uvarint() - 1 if compact else self.int16()
        text = self._data[self._pos : self._pos + length].decode()
        self._pos += length
        return text

    def count(self, compact: bool) -> int:
        return self.uvarint() - 1 if compact else self.int32()

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self._pos += self.uvarint()


def _txn_value(offset: int, transactional_id: str, value: bytes | None) -> TxnLogEntry:
    if value is None:
        return TxnLogEntry(offset, transactional_id, None, None, None, (), None)
    reader = _Reader(value)
    flexible = reader.int16() >= 1
    producer_id = reader.int64()
    epoch = reader.int16()
    reader.int32()
    state = TXN_STATES.get(reader.int8(), "?")
    partitions = []
    for _ in range(max(reader.count(flexible), 0)):
        topic = reader.string(flexible)
        partitions.extend(f"{topic}-{reader.int32()}" for _ in range(reader.count(flexible)))
        if flexible:
            reader.skip_tags()
    last_update = reader.int64()
    return TxnLogEntry(
        offset, transactional_id, producer_id, epoch, state, tuple(sorted(partitions)), last_update
    )


def transaction_log(log_dir: Path, transactional_id: str | None = None) -> list[TxnLogEntry]:
    """What the coordinator wrote for ``transactional_id`` (every id when None), in log order."""
    entries = []
    for folder in sorted(log_dir.glob(f"{TRANSACTION_STATE_TOPIC}-*")):
        for segment in sorted(folder.glob("*.log")):
            for raw in _batches_of(segment):
                if raw.is_control_batch:  # type: ignore[attr-defined]
                    continue
                for record in raw:  # type: ignore[attr-defined]
                    key = _Reader(record.key)
                    key.int16()
                    tid = key.string(compact=False)
                    if transactional_id is None or tid == transactional_id:
                        entries.append(_txn_value(record.offset, tid, record.value))
    return entries


def explain(log_dir: Path, topic: str, partition: int, transactional_id: str) -> str:
    """A partition's open batches and its late markers (see :func:`late_markers`), with what the
    coordinator last wrote for the transactional id that writes the partition."""
    batches = partition_batches(log_dir, topic, partition)
    dangling = open_batches(batches)
    lines = [f"{topic}-{partition}: {len(dangling)} open batch(es)"]
    if dangling:
        first = batches.index(dangling[0])
        lines += [f"  {batch}" for batch in batches[max(first - 4, 0) : first + 8]]
    for marker, ended in late_markers(batches):
        lines.append(f"  {marker} ended:")
        lines += [f"    {batch}" for batch in ended]
    lines.append(f"transaction log of {transactional_id} (last entries):")
    lines += [f"  {entry}" for entry in transaction_log(log_dir, transactional_id)[-8:]]
    return "\n".join(lines)
