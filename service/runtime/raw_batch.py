"""Kafka record batches (format version 2, KIP-98) read from a fetch response's bytes, for the
batch whose record aiokafka's consumer could not read (``unreadable.py``).

aiokafka decodes a header key with strict UTF-8 and, as it must parse a batch's records in
order, cannot hand out any record of the batch from the bad one on. Here a header key that is
not UTF-8 is read as Kafka's Java client reads it, each invalid sequence replaced by U+FFFD, so
the record and the ones after it are read as they are. A batch whose checksum fails, whose
compression is not known, or whose records do not parse is read as a :class:`RawBatch` with a
``fault`` and no records: every offset of it is unreadable.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from aiokafka.codec import gzip_decode, lz4_decode, snappy_decode, zstd_decode
from aiokafka.record.util import calc_crc32c, decode_varint

from service.runtime.work import Header

_HEAD = struct.Struct(">qiibIhiqqqhii")
"""base offset, batch length, partition leader epoch, magic, crc, attributes, last offset
delta, base timestamp, max timestamp, producer id, producer epoch, base sequence, record count"""
_LENGTH_END = 12
"""Where the batch length ends: the batch is ``_LENGTH_END`` + that length bytes long."""
_CRC_FROM = 21
"""The checksum covers the batch from its attributes on."""
_CODECS: dict[int, Callable[[bytes], bytes]] = {
    1: gzip_decode,
    2: snappy_decode,
    3: lz4_decode,
    4: zstd_decode,
}
_CODEC_MASK = 0x07
_LOG_APPEND_TIME = 0x08
_CONTROL = 0x20


@dataclass(frozen=True, slots=True)
class RawRecord:
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[Header]
    replaced_keys: int
    """How many of its header keys were not UTF-8 (read with U+FFFD)."""


@dataclass(frozen=True, slots=True)
class RawBatch:
    base_offset: int
    last_offset: int
    records: list[RawRecord]
    control: bool
    fault: str | None = None
    """Why its records could not be read (then ``records`` is empty)."""


def batch_at(data: bytes, offset: int) -> RawBatch | None:
    """The batch of ``data`` (a fetch response's record set) that holds ``offset``, or ``None``
    when no whole batch of format version 2 does."""
    view = memoryview(data)
    pos = 0
    while pos + _HEAD.size <= len(view):
        head = _HEAD.unpack_from(view, pos)
        base, length, magic, crc, attributes, last_delta = head[0], head[1], *head[3:7]
        end = pos + _LENGTH_END + length
        if end > len(view) or length < _HEAD.size - _LENGTH_END:
            return None
        if magic == 2 and base <= offset <= base + last_delta:
            batch = RawBatch(base, base + last_delta, [], bool(attributes & _CONTROL))
            if batch.control:
                return batch  # a transaction marker: no records of the log's
            body = bytes(view[pos:end])
            if calc_crc32c(body[_CRC_FROM:]) != crc:
                return _faulty(batch, "the batch's checksum does not match its bytes")
            try:
                records = _records(body, head, attributes)
            except Exception as exc:  # noqa: BLE001 - any failure on these bytes is the batch's
                return _faulty(batch, f"its records do not parse: {exc!r}")
            return RawBatch(batch.base_offset, batch.last_offset, records, batch.control)
        pos = end
    return None


def _faulty(batch: RawBatch, fault: str) -> RawBatch:
    return RawBatch(batch.base_offset, batch.last_offset, [], batch.control, fault)


def _records(body: bytes, head: tuple[int, ...], attributes: int) -> list[RawRecord]:
    base_offset, base_time, max_time, count = head[0], head[7], head[8], head[12]
    payload = body[_HEAD.size :]
    codec = attributes & _CODEC_MASK
    if codec:
        if codec not in _CODECS:
            raise ValueError(f"unknown compression codec {codec}")
        payload = _CODECS[codec](payload)
    buffer = bytearray(payload)
    records = []
    pos = 0
    for _ in range(count):
        length, pos = decode_varint(buffer, pos)
        end = pos + length
        pos += 1  # the record's attributes: none defined
        time_delta, pos = decode_varint(buffer, pos)
        offset_delta, pos = decode_varint(buffer, pos)
        key, pos = _bytes(buffer, pos)
        value, pos = _bytes(buffer, pos)
        header_count, pos = decode_varint(buffer, pos)
        headers: list[Header] = []
        replaced = 0
        for _ in range(header_count):
            raw_key, pos = _bytes(buffer, pos)
            header_value, pos = _bytes(buffer, pos)
            try:
                name = (raw_key or b"").decode("utf-8")
            except UnicodeDecodeError:
                name = (raw_key or b"").decode("utf-8", errors="replace")
                replaced += 1
            headers.append((name, header_value))
        if pos != end:
            raise ValueError(f"record at offset delta {offset_delta} is not {length} bytes long")
        timestamp = max_time if attributes & _LOG_APPEND_TIME else base_time + time_delta
        records.append(
            RawRecord(base_offset + offset_delta, timestamp, key, value, headers, replaced)
        )
    return records


def _bytes(buffer: bytearray, pos: int) -> tuple[bytes | None, int]:
    length, pos = decode_varint(buffer, pos)
    if length < 0:
        return None, pos
    end = pos + length
    if end > len(buffer):
        raise ValueError("a field runs past the end of its record")
    return bytes(buffer[pos:end]), end
