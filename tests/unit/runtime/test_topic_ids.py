"""Metadata v12 over aiokafka's protocol types: every field where Kafka's schema puts it.

The layout checked here is Kafka's ``MetadataRequest.json``/``MetadataResponse.json`` at version
12 (flexible: compact strings and arrays hold length + 1 as an unsigned varint, null strings and
arrays are a single 0, a uuid is 16 bytes, every struct ends in an empty tagged-fields byte).
"""

from __future__ import annotations

import base64
import struct
import uuid
from io import BytesIO

import pytest
from aiokafka.protocol.api import RequestHeader_v2

from service.runtime.topic_ids import (
    NO_ID,
    MetadataRequest_v12,
    MetadataResponse_v12,
    TopicIds,
    Uuid,
    format_id,
    topic_ids,
)

ID = uuid.UUID("6a1e0d3c-9b7f-4c2a-8e51-0f2d3c4b5a69").bytes


def _compact(text: str) -> bytes:
    raw = text.encode()
    return bytes([len(raw) + 1]) + raw


def test_every_field_of_the_request_is_where_version_12_puts_it() -> None:
    built = TopicIds(["b", "a", "b"]).build(MetadataRequest_v12)
    assert built.encode() == (
        b"\x03"  # topics: two, each once, in order
        + NO_ID  # topic_id: none, asked by name
        + _compact("a")
        + b"\x00"  # topic tags
        + NO_ID
        + _compact("b")
        + b"\x00"
        + b"\x00"  # allow_auto_topic_creation: never
        + b"\x00"  # include_topic_authorized_operations: no
        + b"\x00"  # request tags
    )


def test_it_travels_with_a_flexible_header_and_only_as_version_12() -> None:
    request = TopicIds(["c"])
    built = request.prepare({3: (0, 13)})
    assert isinstance(built, MetadataRequest_v12)
    assert isinstance(built.build_request_header(1, "c"), RequestHeader_v2)
    with pytest.raises(NotImplementedError, match="TopicIds"):
        request.prepare({3: (0, 11)})


def _partition() -> bytes:
    return (
        struct.pack(">hiii", 0, 0, 1, 5)  # error_code, partition_index, leader_id, leader_epoch
        + b"\x02"
        + struct.pack(">i", 1)  # replica_nodes: [1]
        + b"\x02"
        + struct.pack(">i", 1)  # isr_nodes: [1]
        + b"\x01"  # offline_replicas: []
        + b"\x00"  # partition tags
    )


def _topic(error_code: int, name: str | None, topic_id: bytes) -> bytes:
    return (
        struct.pack(">h", error_code)
        + (_compact(name) if name is not None else b"\x00")
        + topic_id
        + b"\x00"  # is_internal
        + b"\x02"  # partitions: one
        + _partition()
        + struct.pack(">i", -2147483648)  # topic_authorized_operations: not asked
        + b"\x00"  # topic tags
    )


def test_the_response_gives_each_known_topics_id_as_kafkas_tools_print_it() -> None:
    raw = (
        struct.pack(">i", 0)  # throttle_time_ms
        + b"\x02"  # brokers: one
        + struct.pack(">i", 1)  # node_id
        + _compact("localhost")
        + struct.pack(">i", 9092)  # port
        + b"\x00"  # rack: null
        + b"\x00"  # broker tags
        + _compact("cluster")  # cluster_id
        + struct.pack(">i", 1)  # controller_id
        + b"\x04"  # topics: three
        + _topic(0, "commands", ID)
        + _topic(3, "gone", NO_ID)  # UNKNOWN_TOPIC_OR_PARTITION
        + _topic(0, "nameless", NO_ID)  # never an id of none
        + b"\x00"  # response tags
    )
    response = MetadataResponse_v12.decode(BytesIO(raw))
    [broker] = response.brokers
    assert broker == (1, "localhost", 9092, None, {})
    assert (response.cluster_id, response.controller_id) == ("cluster", 1)
    [commands, _, _] = response.topics
    assert commands == (
        0,
        "commands",
        ID,
        False,
        [(0, 0, 1, 5, [1], [1], [], {})],
        -2147483648,
        {},
    )
    expected = base64.urlsafe_b64encode(ID).rstrip(b"=").decode()
    assert topic_ids(response) == {"commands": expected}
    assert len(expected) == 22 and format_id(ID) == expected


def test_a_uuid_is_16_bytes_each_way() -> None:
    assert Uuid.encode(ID) == ID and Uuid.decode(BytesIO(ID + b"rest")) == ID
    with pytest.raises(ValueError, match="16 bytes"):
        Uuid.encode(b"short")
    with pytest.raises(ValueError, match="underrun"):
        Uuid.decode(BytesIO(b"short"))
