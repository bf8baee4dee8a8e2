"""OffsetFetch version 7 (KIP-447): a group's committed offsets, refused while a transaction
that commits offsets for the same partitions is still open (``require_stable``).

Written against aiokafka 0.14.0, whose OffsetFetchRequest stops at version 3. A new owner of a
partition under one transactional producer per instance must not read its starting offset while
the previous owner's transaction that moves it may still commit; with ``require_stable`` the
group coordinator answers ``UNSTABLE_OFFSET_COMMIT`` for such a partition instead, and the owner
asks again. Version 7 is flexible (compact strings and arrays, tagged fields, request header v2);
the request is built from aiokafka's protocol types and sent with its client.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    Boolean,
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Int64,
    Schema,
    TaggedFields,
)
from aiokafka.structs import TopicPartition

API_KEY = 9
UNSTABLE_OFFSET_COMMIT = 88
"""A transaction committing offsets for the partition is still open: ask again."""
NO_OFFSET = -1
NOT_ANSWERED = -1
"""``UNKNOWN_SERVER_ERROR``: the error of a partition asked about that the answer leaves out."""


class OffsetFetchResponse_v7(Response):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = API_KEY
    API_VERSION = 7
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
                        ("committed_offset", Int64),
                        ("committed_leader_epoch", Int32),
                        ("metadata", CompactString("utf-8")),
                        ("error_code", Int16),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("error_code", Int16),
        ("tags", TaggedFields),
    )


class OffsetFetchRequest_v7(RequestStruct):  # type: ignore[misc]  # aiokafka is untyped
    FLEXIBLE_VERSION = True
    API_KEY = API_KEY
    API_VERSION = 7
    RESPONSE_TYPE = OffsetFetchResponse_v7
    SCHEMA = Schema(
        ("group_id", CompactString("utf-8")),
        (
            "topics",
            CompactArray(
                ("name", CompactString("utf-8")),
                ("partition_indexes", CompactArray(Int32)),
                ("tags", TaggedFields),
            ),
        ),
        ("require_stable", Boolean),
        ("tags", TaggedFields),
    )


class StableOffsetFetch(Request[OffsetFetchRequest_v7]):  # type: ignore[misc]
    """The committed offsets of ``partitions`` for ``group_id``; with ``require_stable`` (the
    default) a partition whose offsets an open transaction may still move is answered
    ``UNSTABLE_OFFSET_COMMIT``. Only version 7 is offered."""

    API_KEY = API_KEY

    def __init__(
        self, group_id: str, partitions: Iterable[TopicPartition], *, require_stable: bool = True
    ) -> None:
        self.group_id = group_id
        self.partitions = sorted(partitions)
        self.require_stable = require_stable

    def build(self, request_struct_class: type[OffsetFetchRequest_v7]) -> OffsetFetchRequest_v7:
        by_topic: dict[str, list[int]] = {}
        for tp in self.partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        no_tags: dict[int, bytes] = {}
        topics = [(topic, indexes, no_tags) for topic, indexes in by_topic.items()]
        return request_struct_class(self.group_id, topics, self.require_stable, no_tags)


def fetched(response: OffsetFetchResponse_v7) -> dict[TopicPartition, tuple[int, int]]:
    """By partition: (committed offset, or -1 when none; error code, 0 when fetched)."""
    return {
        TopicPartition(name, partition): (offset, error_code)
        for name, partitions, _ in response.topics
        for partition, offset, _epoch, _metadata, error_code, _ in partitions
    }


def fetched_all(
    response: OffsetFetchResponse_v7, partitions: Iterable[TopicPartition]
) -> dict[TopicPartition, tuple[int, str, int]]:
    """By partition asked about: (committed offset or -1, its metadata, error code).

    A group-level error is the error of every partition asked about: the answer then lists no
    partition (a coordinator that just started, or is loading the group's offsets, answers
    ``NOT_COORDINATOR`` or ``COORDINATOR_LOAD_IN_PROGRESS`` so), and a partition it leaves out
    has no offset to start from, whatever the others say (``UNKNOWN_SERVER_ERROR``).
    """
    if response.error_code:
        return dict.fromkeys(partitions, (NO_OFFSET, "", response.error_code))
    answered = {
        TopicPartition(name, partition): (offset, metadata or "", error_code)
        for name, found, _ in response.topics
        for partition, offset, _epoch, metadata, error_code, _ in found
    }
    return {tp: answered.get(tp, (NO_OFFSET, "", NOT_ANSWERED)) for tp in partitions}
