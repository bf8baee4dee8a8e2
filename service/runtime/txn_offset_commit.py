"""TxnOffsetCommit version 3 (KIP-447): input offsets committed in a transaction with the
consumer group's generation, member id and group instance id.

Written against aiokafka 0.14.0, whose own TxnOffsetCommitRequest stops at version 0: an offset
commit that carries no group membership, so the group coordinator cannot refuse one sent by a
producer whose consumer has left the group or been replaced (a zombie). Version 3 carries the
membership, and the coordinator answers ``ILLEGAL_GENERATION``, ``UNKNOWN_MEMBER_ID`` or
``FENCED_INSTANCE_ID`` to a stale one; that refusal is what lets one transactional producer per
instance replace one per partition (Kafka Streams' exactly_once_v2). Version 3 is the first
flexible version: compact strings and arrays, tagged fields at every level, request header v2.
The request is built from aiokafka's protocol types and sent with its client like any of its
own requests; nothing here touches aiokafka's internals.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Int64,
    Schema,
    TaggedFields,
)
from aiokafka.structs import OffsetAndMetadata, TopicPartition

API_KEY = 28
NO_GENERATION = -1
"""What a commit outside any group generation carries (the coordinator then checks nothing)."""
NO_LEADER_EPOCH = -1


class TxnOffsetCommitResponse_v3(Response):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = API_KEY
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "topics",
            CompactArray(
                ("name", CompactString("utf-8")),
                (
                    "partitions",
                    CompactArray(
                        ("partition_index", Int32),
                        ("error_code", Int16),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class TxnOffsetCommitRequest_v3(RequestStruct):  # type: ignore[misc]  # aiokafka is untyped
    FLEXIBLE_VERSION = True
    API_KEY = API_KEY
    API_VERSION = 3
    RESPONSE_TYPE = TxnOffsetCommitResponse_v3
    SCHEMA = Schema(
        ("transactional_id", CompactString("utf-8")),
        ("group_id", CompactString("utf-8")),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("generation_id", Int32),
        ("member_id", CompactString("utf-8")),
        ("group_instance_id", CompactString("utf-8")),
        (
            "topics",
            CompactArray(
                ("name", CompactString("utf-8")),
                (
                    "partitions",
                    CompactArray(
                        ("partition_index", Int32),
                        ("committed_offset", Int64),
                        ("committed_leader_epoch", Int32),
                        ("committed_metadata", CompactString("utf-8")),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


@dataclass(frozen=True, slots=True)
class Membership:
    """The consumer group membership a transaction's offsets are committed under."""

    generation_id: int
    member_id: str
    group_instance_id: str | None = None


class GroupTxnOffsetCommit(Request[TxnOffsetCommitRequest_v3]):  # type: ignore[misc]
    """Offsets of ``group_id`` committed in the transaction of ``producer_id``/``epoch``, under
    ``membership``; only version 3 is offered (an older broker refuses the request, never
    silently drops the membership)."""

    API_KEY = API_KEY

    def __init__(
        self,
        *,
        transactional_id: str,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        membership: Membership,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
    ) -> None:
        self.transactional_id = transactional_id
        self.group_id = group_id
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.membership = membership
        self.offsets = offsets

    def build(
        self, request_struct_class: type[TxnOffsetCommitRequest_v3]
    ) -> TxnOffsetCommitRequest_v3:
        by_topic: dict[str, list[tuple[int, int, int, str, dict[int, bytes]]]] = {}
        for tp, committed in sorted(self.offsets.items()):
            by_topic.setdefault(tp.topic, []).append(
                (tp.partition, committed.offset, NO_LEADER_EPOCH, committed.metadata, {})
            )
        membership = self.membership
        return request_struct_class(
            self.transactional_id,
            self.group_id,
            self.producer_id,
            self.producer_epoch,
            membership.generation_id,
            membership.member_id,
            membership.group_instance_id,
            [(topic, partitions, {}) for topic, partitions in by_topic.items()],
            {},
        )


def partition_errors(response: TxnOffsetCommitResponse_v3) -> dict[TopicPartition, int]:
    """The error code the coordinator gave each partition (0: committed in the transaction)."""
    return {
        TopicPartition(name, partition): error_code
        for name, partitions, _ in response.topics
        for partition, error_code, _ in partitions
    }
