"""Metadata version 12: a topic's id, the identity a topic deleted and created again does not keep.

Written against aiokafka 0.14.0, whose MetadataRequest stops at version 5 (topic ids came with
version 10, KIP-516). A command's position on the commands topic (its offset) says which
commands a session answered only within one log: the offsets of a topic created anew start
again at 0. The id tells the logs apart. Version 12 is flexible (compact strings and arrays,
tagged fields, request header v2); the request is built from aiokafka's protocol types and sent
with its client. A broker older than Kafka 3.1 does not speak it: then no id is known.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from io import BytesIO

from aiokafka.protocol.abstract import AbstractType
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    Boolean,
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Schema,
    TaggedFields,
)

API_KEY = 3
NO_ID = bytes(16)
"""The id Kafka uses for none (``Uuid.ZERO_UUID``): a topic asked for by name."""
NO_TAGS: dict[int, bytes] = {}


class Uuid(AbstractType[bytes]):  # type: ignore[misc]  # aiokafka is untyped
    """Kafka's ``uuid`` type: 16 bytes as they are."""

    @classmethod
    def encode(cls, value: bytes) -> bytes:
        if len(value) != 16:
            raise ValueError(f"a uuid is 16 bytes, not {len(value)}")
        return value

    @classmethod
    def decode(cls, data: BytesIO) -> bytes:
        value = data.read(16)
        if len(value) != 16:
            raise ValueError("Buffer underrun decoding uuid")
        return value


class MetadataResponse_v12(Response):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = API_KEY
    API_VERSION = 12
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "brokers",
            CompactArray(
                ("node_id", Int32),
                ("host", CompactString("utf-8")),
                ("port", Int32),
                ("rack", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("cluster_id", CompactString("utf-8")),
        ("controller_id", Int32),
        (
            "topics",
            CompactArray(
                ("error_code", Int16),
                ("name", CompactString("utf-8")),
                ("topic_id", Uuid),
                ("is_internal", Boolean),
                (
                    "partitions",
                    CompactArray(
                        ("error_code", Int16),
                        ("partition_index", Int32),
                        ("leader_id", Int32),
                        ("leader_epoch", Int32),
                        ("replica_nodes", CompactArray(Int32)),
                        ("isr_nodes", CompactArray(Int32)),
                        ("offline_replicas", CompactArray(Int32)),
                        ("tags", TaggedFields),
                    ),
                ),
                ("topic_authorized_operations", Int32),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class MetadataRequest_v12(RequestStruct):  # type: ignore[misc]  # aiokafka is untyped
    FLEXIBLE_VERSION = True
    API_KEY = API_KEY
    API_VERSION = 12
    RESPONSE_TYPE = MetadataResponse_v12
    SCHEMA = Schema(
        (
            "topics",
            CompactArray(
                ("topic_id", Uuid),
                ("name", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("allow_auto_topic_creation", Boolean),
        ("include_topic_authorized_operations", Boolean),
        ("tags", TaggedFields),
    )


class TopicIds(Request[MetadataRequest_v12]):  # type: ignore[misc]
    """The metadata of ``topics`` by name, never creating one. Only version 12 is offered."""

    API_KEY = API_KEY

    def __init__(self, topics: Iterable[str]) -> None:
        self.topics = sorted(set(topics))

    def build(self, request_struct_class: type[MetadataRequest_v12]) -> MetadataRequest_v12:
        asked = [(NO_ID, name, NO_TAGS) for name in self.topics]
        return request_struct_class(asked, False, False, NO_TAGS)


def topic_ids(response: MetadataResponse_v12) -> dict[str, str]:
    """By topic name: its id as Kafka's tools print it (URL-safe base64, no padding), for every
    topic the answer knows without an error."""
    return {
        name: format_id(topic_id)
        for error_code, name, topic_id, *_ in response.topics
        if error_code == 0 and name is not None and topic_id != NO_ID
    }


def format_id(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
