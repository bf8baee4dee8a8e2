"""Input records aiokafka cannot read: the batch reader of ``raw_batch.py`` (against batches
aiokafka's own builder writes), what the runtime takes of a batch, and what an owner does with a
record that cannot be read at all (``tests/integration/test_unreadable_records.py`` runs the
whole path on a real broker)."""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.record.util import calc_crc32c

from service.runtime.partition_owner import OwnerExit
from service.runtime.raw_batch import RawBatch, batch_at
from service.runtime.unreadable import UNREADABLE_AT_ONCE, batch_records
from service.wire.dlq import read_dlq_headers
from tests.support.memory_kafka import MemoryKafka
from tests.support.owner_harness import (
    COMMANDS_0,
    TOPICS,
    Instance,
    answered,
    command,
    committed,
    put,
    shorten_waits,
    until,
)
from tests.support.unreadable_writer import BAD_HEADER_KEY, BadKey


def _batch(
    base_offset: int,
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
    *,
    compression: int = 0,
) -> bytes:
    builder = _DefaultRecordBatchBuilderPy(2, compression, 0, -1, -1, -1, 1 << 20)
    for delta, (key, value, headers) in enumerate(records):
        builder.append(delta, 1_000 + delta, key, value, headers)
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base_offset)  # the broker's offsets; outside the checksum
    return bytes(data)


def _resign(data: bytearray) -> bytes:
    struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[21:])))
    return bytes(data)


GOOD = [(b"k1", b"v1", [("h", b"1")]), (None, None, [("n", None)]), (b"k3", b"", [])]


CODECS = {"plain": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


@pytest.mark.parametrize("compression", CODECS.values(), ids=CODECS.keys())
def test_a_batch_reads_as_aiokafka_reads_it(compression: int) -> None:
    data = _batch(40, GOOD, compression=compression)
    batch = batch_at(data, 41)
    assert batch is not None and batch.fault is None
    assert (batch.base_offset, batch.last_offset, batch.control) == (40, 42, False)
    theirs = MemoryRecords(data).next_batch()
    assert theirs is not None
    assert [(r.offset, r.timestamp_ms, r.key, r.value, r.headers) for r in batch.records] == [
        (r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in theirs
    ]


def test_a_header_key_not_utf8_reads_with_replacement_and_the_records_after_it_too() -> None:
    data = _batch(
        7, [(b"a", b"1", []), (b"b", b"2", [(BadKey("x"), b"v"), ("ok", b"w")]), (b"c", b"3", [])]
    )
    with pytest.raises(UnicodeDecodeError):
        list(MemoryRecords(data).next_batch() or [])
    batch = batch_at(data, 8)
    assert batch is not None and batch.fault is None
    assert [(r.offset, r.value, r.headers, r.replaced_keys) for r in batch.records] == [
        (7, b"1", [], 0),
        (8, b"2", [(BAD_HEADER_KEY.decode(errors="replace"), b"v"), ("ok", b"w")], 1),
        (9, b"3", [], 0),
    ]


def test_the_batch_holding_the_offset_is_read_of_several_and_a_cut_one_is_none() -> None:
    first, second = _batch(0, GOOD), _batch(3, [(b"x", b"y", [])])
    found = batch_at(first + second, 3)
    assert found is not None and [r.offset for r in found.records] == [3]
    assert batch_at(first + second[:-1], 3) is None, "the fetch cut it short"
    assert batch_at(first, 3) is None


def test_log_append_time_gives_every_record_the_batchs_max_timestamp() -> None:
    data = bytearray(_batch(0, GOOD))
    struct.pack_into(">h", data, 21, struct.unpack_from(">h", data, 21)[0] | 0x08)
    struct.pack_into(">q", data, 35, 99_999)
    batch = batch_at(_resign(data), 0)
    assert batch is not None and {r.timestamp_ms for r in batch.records} == {99_999}


@pytest.mark.parametrize(
    ("damage", "fault"),
    [
        (lambda data: data.__setitem__(-1, data[-1] ^ 0xFF), "checksum"),
        (lambda data: struct.pack_into(">h", data, 21, 7), "do not parse"),
        (lambda data: data.__setitem__(slice(61, 62), b"\x7e"), "do not parse"),
        (lambda data: struct.pack_into(">h", data, 21, CODECS["zstd"]), "do not parse"),
    ],
    ids=["checksum", "unknown-codec", "record-length", "not-compressed-as-said"],
)
def test_a_batch_that_cannot_be_read_has_a_fault_and_no_records(damage: Any, fault: str) -> None:
    data = bytearray(_batch(5, GOOD))
    damage(data)
    if fault != "checksum":
        data = bytearray(_resign(data))
    batch = batch_at(bytes(data), 6)
    assert batch is not None and batch.records == []
    assert batch.fault is not None and fault in batch.fault
    assert (batch.base_offset, batch.last_offset) == (5, 7)


def test_the_runtime_takes_a_batch_from_the_offset_on_and_every_offset_of_a_faulty_one() -> None:
    tp = TopicPartition(TOPICS.commands, 0)
    batch = batch_at(_batch(10, GOOD), 11)
    assert batch is not None
    taken, after = batch_records(tp, batch, 11)
    assert after == 13
    assert [(r.origin.offset, r.key, r.unreadable) for r in taken] == [
        (11, None, None),
        (12, b"k3", None),
    ]
    faulty, after = batch_records(tp, RawBatch(10, 13, [], False, "the batch's checksum fails"), 11)
    assert [r.origin.offset for r in faulty] == [11, 12, 13] and after == 14
    assert all(r.key is None and r.value is None and r.headers == [] for r in faulty)
    assert all("the batch's checksum fails" in str(r.unreadable) for r in faulty)


@pytest.fixture
def short_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    shorten_waits(monkeypatch)


@pytest.mark.usefixtures("short_waits")
@pytest.mark.parametrize("topic", [TOPICS.commands, TOPICS.control])
async def test_an_unreadable_record_is_dead_lettered_in_its_place_and_the_partition_goes_on(
    tmp_path: Path, topic: str
) -> None:
    kafka = MemoryKafka()
    put(kafka, command(0))
    at = kafka.append(topic, 0, None, None, unreadable="its batch's checksum fails")
    put(kafka, command(2))
    async with Instance(kafka, tmp_path) as instance:
        owner, task = instance.owner()
        await until(lambda: answered(kafka)["c2"] == 1, "c2")
        await until(lambda: len(kafka.visible(TOPICS.dlq)) == 1, "the dead letter")
        assert await instance.stop(owner, task) is OwnerExit.STOPPED
    assert answered(kafka) == Counter({"c0": 1, "c2": 1})
    [letter] = [e.record for e in kafka.logs[(TOPICS.dlq, 0)] if e.state == "committed"]
    assert (letter.key, letter.value) == (None, None)
    ours = read_dlq_headers(letter.headers)
    assert ours.code == "invalid_command" and ours.reason == "its batch's checksum fails"
    assert (ours.source_topic, ours.source_offset) == (topic, str(at))
    if topic == TOPICS.commands:
        assert committed(kafka, COMMANDS_0) > at
    assert orjson.loads(kafka.visible(TOPICS.results)[0] or b"{}")["command_id"] == "c0"


def test_a_transaction_marker_gives_no_records() -> None:
    data = bytearray(_batch(4, [(b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00", [])]))
    struct.pack_into(">h", data, 21, 0x30)  # transactional, control
    batch = batch_at(_resign(data), 4)
    assert batch is not None and batch.control and batch.records == [] and batch.fault is None


def test_a_faulty_batch_gives_a_bounded_number_of_unreadable_records_at_once() -> None:
    """Its length is in doubt when its checksum fails: the rest comes at the next step."""
    tp = TopicPartition(TOPICS.commands, 0)
    huge = RawBatch(0, 2**31, [], False, "the batch's checksum does not match its bytes")
    taken, after = batch_records(tp, huge, 5)
    assert len(taken) == UNREADABLE_AT_ONCE and after == 5 + UNREADABLE_AT_ONCE
    assert taken[-1].origin.offset == after - 1
