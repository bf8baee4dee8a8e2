"""TxnOffsetCommit v3 over aiokafka's protocol types: every field where Kafka's schema puts it.

The layout checked here is Kafka's ``TxnOffsetCommitRequest.json``/``Response.json`` at version 3
(flexible: compact strings and arrays hold length + 1 as an unsigned varint, null strings are a
single 0, every struct ends in an empty tagged-fields byte).
"""

from __future__ import annotations

import struct
from io import BytesIO

import pytest
from aiokafka.protocol.api import RequestHeader_v2
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from service.runtime.txn_offset_commit import (
    GroupTxnOffsetCommit,
    Membership,
    TxnOffsetCommitRequest_v3,
    TxnOffsetCommitResponse_v3,
    partition_errors,
)

MEMBER = Membership(7, "m-1", "pod-0")


def _request(
    membership: Membership = MEMBER,
    offsets: dict[TopicPartition, OffsetAndMetadata] | None = None,
) -> bytes:
    given = offsets or {TopicPartition("c", 2): OffsetAndMetadata(42, "")}
    built = GroupTxnOffsetCommit(
        transactional_id="tx",
        group_id="g",
        producer_id=5,
        producer_epoch=3,
        membership=membership,
        offsets=given,
    ).build(TxnOffsetCommitRequest_v3)
    encoded: bytes = built.encode()
    return encoded


def _compact(text: str | None) -> bytes:
    if text is None:
        return b"\x00"
    raw = text.encode()
    return bytes([len(raw) + 1]) + raw


EXPECTED = (
    _compact("tx")  # transactional_id
    + _compact("g")  # group_id
    + struct.pack(">q", 5)  # producer_id
    + struct.pack(">h", 3)  # producer_epoch
    + struct.pack(">i", 7)  # generation_id
    + _compact("m-1")  # member_id
    + _compact("pod-0")  # group_instance_id
    + b"\x02"  # topics: one
    + _compact("c")  # topic name
    + b"\x02"  # partitions: one
    + struct.pack(">i", 2)  # partition_index
    + struct.pack(">q", 42)  # committed_offset
    + struct.pack(">i", -1)  # committed_leader_epoch
    + _compact("")  # committed_metadata
    + b"\x00"  # partition tags
    + b"\x00"  # topic tags
    + b"\x00"  # request tags
)


def test_every_field_is_where_version_3_puts_it() -> None:
    assert _request() == EXPECTED


@pytest.mark.parametrize(
    ("field", "membership", "fragment"),
    [
        ("generation_id", Membership(123456, "m-1", "pod-0"), struct.pack(">i", 123456)),
        ("member_id", Membership(7, "member-xyz", "pod-0"), _compact("member-xyz")),
        ("group_instance_id", Membership(7, "m-1", "static-a"), _compact("static-a")),
        ("group_instance_id null", Membership(7, "m-1", None), _compact("m-1") + b"\x00\x02"),
        ("no generation", Membership(-1, "", None), struct.pack(">i", -1) + b"\x01\x00"),
    ],
)
def test_each_membership_field_is_encoded(
    field: str, membership: Membership, fragment: bytes
) -> None:
    assert fragment in _request(membership), field


def test_the_producer_fields_are_encoded() -> None:
    encoded = _request()
    head = _compact("tx") + _compact("g")
    assert encoded.startswith(head + struct.pack(">qh", 5, 3))


def test_offsets_are_grouped_by_topic_in_order_and_round_trip() -> None:
    offsets = {
        TopicPartition("b", 1): OffsetAndMetadata(10, "x"),
        TopicPartition("a", 0): OffsetAndMetadata(3, ""),
        TopicPartition("b", 0): OffsetAndMetadata(9, ""),
    }
    decoded = TxnOffsetCommitRequest_v3.SCHEMA.decode(BytesIO(_request(offsets=offsets)))
    *head, topics, tags = decoded
    assert head == ["tx", "g", 5, 3, 7, "m-1", "pod-0"]
    assert topics == [
        ("a", [(0, 3, -1, "", {})], {}),
        ("b", [(0, 9, -1, "", {}), (1, 10, -1, "x", {})], {}),
    ]
    assert tags == {}


def test_it_travels_with_a_flexible_header_and_only_as_version_3() -> None:
    request = GroupTxnOffsetCommit(
        transactional_id="tx",
        group_id="g",
        producer_id=5,
        producer_epoch=3,
        membership=Membership(7, "m-1"),
        offsets={},
    )
    built = request.prepare({28: (0, 5)})
    assert isinstance(built, TxnOffsetCommitRequest_v3)
    assert isinstance(built.build_request_header(1, "c"), RequestHeader_v2)
    with pytest.raises(NotImplementedError, match="GroupTxnOffsetCommit"):
        request.prepare({28: (0, 2)})


def test_the_response_gives_an_error_code_per_partition() -> None:
    raw = (
        struct.pack(">i", 0)  # throttle_time_ms
        + b"\x02"
        + _compact("c")
        + b"\x03"
        + struct.pack(">ih", 0, 0)
        + b"\x00"
        + struct.pack(">ih", 1, 22)  # ILLEGAL_GENERATION
        + b"\x00"
        + b"\x00"
        + b"\x00"
    )
    response = TxnOffsetCommitResponse_v3.decode(BytesIO(raw))
    assert partition_errors(response) == {
        TopicPartition("c", 0): 0,
        TopicPartition("c", 1): 22,
    }
