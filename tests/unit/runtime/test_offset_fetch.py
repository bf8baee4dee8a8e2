"""OffsetFetch v7 over aiokafka's protocol types: every field where Kafka's schema puts it.

The layout checked here is Kafka's ``OffsetFetchRequest.json``/``Response.json`` at version 7
(flexible: compact strings and arrays hold length + 1 as an unsigned varint, null strings are a
single 0, every struct ends in an empty tagged-fields byte).
"""

from __future__ import annotations

import struct
from io import BytesIO

import pytest
from aiokafka.protocol.api import RequestHeader_v2
from aiokafka.structs import TopicPartition

from service.runtime.offset_fetch import (
    NOT_ANSWERED,
    UNSTABLE_OFFSET_COMMIT,
    OffsetFetchRequest_v7,
    OffsetFetchResponse_v7,
    StableOffsetFetch,
    fetched,
    fetched_all,
)


def _compact(text: str) -> bytes:
    raw = text.encode()
    return bytes([len(raw) + 1]) + raw


def _request(*partitions: TopicPartition, require_stable: bool = True) -> bytes:
    built = StableOffsetFetch("g", partitions, require_stable=require_stable).build(
        OffsetFetchRequest_v7
    )
    encoded: bytes = built.encode()
    return encoded


def test_every_field_is_where_version_7_puts_it() -> None:
    assert _request(TopicPartition("c", 2), TopicPartition("c", 0)) == (
        _compact("g")  # group_id
        + b"\x02"  # topics: one
        + _compact("c")  # name
        + b"\x03"  # partition_indexes: two
        + struct.pack(">ii", 0, 2)  # in order
        + b"\x00"  # topic tags
        + b"\x01"  # require_stable
        + b"\x00"  # request tags
    )


def test_require_stable_is_its_own_byte() -> None:
    tp = TopicPartition("c", 0)
    stable, loose = _request(tp), _request(tp, require_stable=False)
    assert stable[:-2] == loose[:-2]
    assert (stable[-2:], loose[-2:]) == (b"\x01\x00", b"\x00\x00")


def test_partitions_are_grouped_by_topic() -> None:
    raw = _request(TopicPartition("b", 1), TopicPartition("a", 0), TopicPartition("b", 0))
    group, topics, require_stable, tags = OffsetFetchRequest_v7.SCHEMA.decode(BytesIO(raw))
    assert (group, require_stable, tags) == ("g", True, {})
    assert topics == [("a", [0], {}), ("b", [0, 1], {})]


def test_it_travels_with_a_flexible_header_and_only_as_version_7() -> None:
    request = StableOffsetFetch("g", [TopicPartition("c", 0)])
    built = request.prepare({9: (1, 9)})
    assert isinstance(built, OffsetFetchRequest_v7)
    assert isinstance(built.build_request_header(1, "c"), RequestHeader_v2)
    with pytest.raises(NotImplementedError, match="StableOffsetFetch"):
        request.prepare({9: (1, 6)})


def test_the_response_gives_offset_and_error_per_partition() -> None:
    raw = (
        struct.pack(">i", 0)  # throttle_time_ms
        + b"\x02"
        + _compact("c")
        + b"\x03"
        + struct.pack(">iqi", 0, 42, -1)
        + b"\x01"  # metadata ""
        + struct.pack(">h", 0)
        + b"\x00"
        + struct.pack(">iqi", 1, -1, -1)
        + b"\x00"  # metadata null
        + struct.pack(">h", UNSTABLE_OFFSET_COMMIT)
        + b"\x00"
        + b"\x00"  # topic tags
        + struct.pack(">h", 0)  # error_code
        + b"\x00"
    )
    response = OffsetFetchResponse_v7.decode(BytesIO(raw))
    assert fetched(response) == {
        TopicPartition("c", 0): (42, 0),
        TopicPartition("c", 1): (-1, UNSTABLE_OFFSET_COMMIT),
    }


NOT_COORDINATOR = 16


def _response(error_code: int, *partitions: tuple[int, int]) -> OffsetFetchResponse_v7:
    """A response for topic ``c``: (partition, offset) with metadata ``m`` and no error."""
    listed = b"".join(
        struct.pack(">iqi", partition, offset, -1) + _compact("m") + struct.pack(">h", 0) + b"\x00"
        for partition, offset in partitions
    )
    topics = b"\x02" + _compact("c") + bytes([len(partitions) + 1]) + listed + b"\x00"
    raw = (
        struct.pack(">i", 0)
        + (topics if partitions else b"\x01")
        + struct.pack(">h", error_code)
        + b"\x00"
    )
    return OffsetFetchResponse_v7.decode(BytesIO(raw))


def test_a_group_level_error_is_every_asked_partitions_error() -> None:
    """A broker's coordinator that just started answers so (Kafka 4.4, seen: error 16 and no
    partition for a moment after a restart); read as an answer of no partition, it gave an
    owner no start, and the owner then read from where its consumer was."""
    asked = [TopicPartition("c", 0), TopicPartition("d", 0)]
    assert fetched_all(_response(NOT_COORDINATOR), asked) == dict.fromkeys(
        asked, (-1, "", NOT_COORDINATOR)
    )


def test_a_partition_the_answer_leaves_out_is_an_error_not_nothing_committed() -> None:
    asked = [TopicPartition("c", 0), TopicPartition("c", 1)]
    assert fetched_all(_response(0, (0, 42)), asked) == {
        TopicPartition("c", 0): (42, "m", 0),
        TopicPartition("c", 1): (-1, "", NOT_ANSWERED),
    }
