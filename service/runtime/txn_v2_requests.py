"""The requests of Kafka's transactions version 2 (KIP-890 part 2), over aiokafka's protocol types.

Written against aiokafka 0.14.0, whose producer sends Produce up to version 8, EndTxn version 0
and InitProducerId version 0, and against a Kafka 4.4.0 broker. Under transactions version 2
(broker feature ``transaction.version=2``, the default of a cluster formatted by Kafka 4.0 or
later) a transaction needs no ``AddPartitionsToTxn``: the partition leader adds a partition to
the transaction when a Produce of version 12 or later writes to it. EndTxn version 5 answers
with the producer id and the epoch of the next transaction: the coordinator bumps the epoch at
every commit and abort, so a late write of an ended transaction can never join the next one.

(TxnOffsetCommit version 5 is meant to add the group's offsets partition in the same way; Kafka
4.4.0 answers it ``INVALID_TXN_STATE`` unless ``AddOffsetsToTxn`` came first, so offsets still
take that request and version 3, ``txn_offset_commit.py``.)

Each request is offered in exactly one version: the broker either speaks it or refuses it, and a
request is never silently sent in an older version with other semantics. All three are flexible
versions (compact strings and arrays, tagged fields at every level, request header v2).
"""

from __future__ import annotations

from collections.abc import Mapping

from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    Boolean,
    CompactArray,
    CompactBytes,
    CompactString,
    Int16,
    Int32,
    Int64,
    Schema,
    TaggedFields,
)
from aiokafka.structs import TopicPartition

PRODUCE_KEY = 0
INIT_PRODUCER_ID_KEY = 22
END_TXN_KEY = 26
ACKS_ALL = -1
NO_PRODUCER_ID = -1
NO_TAGS: dict[int, bytes] = {}


class ProduceResponse_v12(Response):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = PRODUCE_KEY
    API_VERSION = 12
    SCHEMA = Schema(
        (
            "responses",
            CompactArray(
                ("name", CompactString("utf-8")),
                (
                    "partition_responses",
                    CompactArray(
                        ("index", Int32),
                        ("error_code", Int16),
                        ("base_offset", Int64),
                        ("log_append_time_ms", Int64),
                        ("log_start_offset", Int64),
                        (
                            "record_errors",
                            CompactArray(
                                ("batch_index", Int32),
                                ("batch_index_error_message", CompactString("utf-8")),
                                ("tags", TaggedFields),
                            ),
                        ),
                        ("error_message", CompactString("utf-8")),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("throttle_time_ms", Int32),
        ("tags", TaggedFields),
    )


class ProduceRequest_v12(RequestStruct):  # type: ignore[misc]  # aiokafka is untyped
    FLEXIBLE_VERSION = True
    API_KEY = PRODUCE_KEY
    API_VERSION = 12
    RESPONSE_TYPE = ProduceResponse_v12
    SCHEMA = Schema(
        ("transactional_id", CompactString("utf-8")),
        ("acks", Int16),
        ("timeout_ms", Int32),
        (
            "topic_data",
            CompactArray(
                ("name", CompactString("utf-8")),
                (
                    "partition_data",
                    CompactArray(
                        ("index", Int32),
                        ("records", CompactBytes),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class TxnProduce(Request[ProduceRequest_v12]):  # type: ignore[misc]
    """Record batches of ``transactional_id``'s open transaction, one per partition, written
    with ``acks=all``; the leader adds each partition to the transaction."""

    API_KEY = PRODUCE_KEY

    def __init__(
        self,
        transactional_id: str,
        batches: Mapping[TopicPartition, bytes | bytearray],
        timeout_ms: int,
    ) -> None:
        self.transactional_id = transactional_id
        self.batches = batches
        self.timeout_ms = timeout_ms
        self.required_acks = ACKS_ALL
        """Read by aiokafka's client: a request with acks 0 gets no response."""

    def build(self, request_struct_class: type[ProduceRequest_v12]) -> ProduceRequest_v12:
        by_topic: dict[str, list[tuple[int, bytes | bytearray, dict[int, bytes]]]] = {}
        for tp, records in self.batches.items():
            by_topic.setdefault(tp.topic, []).append((tp.partition, records, NO_TAGS))
        topics = [(topic, partitions, NO_TAGS) for topic, partitions in by_topic.items()]
        return request_struct_class(
            self.transactional_id, ACKS_ALL, self.timeout_ms, topics, NO_TAGS
        )


def produced(response: ProduceResponse_v12) -> dict[TopicPartition, tuple[int, int]]:
    """By partition: (error code, base offset of the batch written)."""
    return {
        TopicPartition(name, partition[0]): (partition[1], partition[2])
        for name, partitions, _ in response.responses
        for partition in partitions
    }


PRODUCER_ANSWER = Schema(
    ("throttle_time_ms", Int32),
    ("error_code", Int16),
    ("producer_id", Int64),
    ("producer_epoch", Int16),
    ("tags", TaggedFields),
)
"""InitProducerId v5 and EndTxn v5 answer alike: an error code, and the producer id and epoch
to use from now on."""


class InitProducerIdResponse_v5(Response):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = INIT_PRODUCER_ID_KEY
    API_VERSION = 5
    SCHEMA = PRODUCER_ANSWER


class InitProducerIdRequest_v5(RequestStruct):  # type: ignore[misc]  # aiokafka is untyped
    FLEXIBLE_VERSION = True
    API_KEY = INIT_PRODUCER_ID_KEY
    API_VERSION = 5
    RESPONSE_TYPE = InitProducerIdResponse_v5
    SCHEMA = Schema(
        ("transactional_id", CompactString("utf-8")),
        ("transaction_timeout_ms", Int32),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("tags", TaggedFields),
    )


class InitProducerId(Request[InitProducerIdRequest_v5]):  # type: ignore[misc]
    """A producer id and epoch for ``transactional_id``: fences every earlier producer of the id
    and aborts the transaction it left open (``CONCURRENT_TRANSACTIONS`` until that is done)."""

    API_KEY = INIT_PRODUCER_ID_KEY

    def __init__(self, transactional_id: str, transaction_timeout_ms: int) -> None:
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms

    def build(
        self, request_struct_class: type[InitProducerIdRequest_v5]
    ) -> InitProducerIdRequest_v5:
        return request_struct_class(
            self.transactional_id,
            self.transaction_timeout_ms,
            NO_PRODUCER_ID,
            NO_PRODUCER_ID,
            NO_TAGS,
        )


class EndTxnResponse_v5(Response):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = END_TXN_KEY
    API_VERSION = 5
    SCHEMA = PRODUCER_ANSWER


class EndTxnRequest_v5(RequestStruct):  # type: ignore[misc]  # aiokafka is untyped
    FLEXIBLE_VERSION = True
    API_KEY = END_TXN_KEY
    API_VERSION = 5
    RESPONSE_TYPE = EndTxnResponse_v5
    SCHEMA = Schema(
        ("transactional_id", CompactString("utf-8")),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("committed", Boolean),
        ("tags", TaggedFields),
    )


class EndTxn(Request[EndTxnRequest_v5]):  # type: ignore[misc]
    """Commit (or abort) the open transaction; the answer names the producer id and epoch of
    the next one."""

    API_KEY = END_TXN_KEY

    def __init__(
        self, transactional_id: str, producer_id: int, producer_epoch: int, *, committed: bool
    ) -> None:
        self.transactional_id = transactional_id
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.committed = committed

    def build(self, request_struct_class: type[EndTxnRequest_v5]) -> EndTxnRequest_v5:
        return request_struct_class(
            self.transactional_id, self.producer_id, self.producer_epoch, self.committed, NO_TAGS
        )
