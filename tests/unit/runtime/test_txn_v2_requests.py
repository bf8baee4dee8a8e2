"""Produce v12, InitProducerId v5 and EndTxn v5 over aiokafka's protocol types: every field where
Kafka 4.4.0's schemas put it (flexible versions: compact strings, arrays and bytes hold length + 1
as an unsigned varint, a null string is a single 0, every struct ends in a tagged-fields count)."""

from __future__ import annotations

import struct

import pytest
from aiokafka.protocol.api import RequestHeader_v2
from aiokafka.structs import TopicPartition

from service.runtime.txn_v2_requests import (
    EndTxn,
    EndTxnRequest_v5,
    EndTxnResponse_v5,
    InitProducerId,
    InitProducerIdRequest_v5,
    InitProducerIdResponse_v5,
    ProduceRequest_v12,
    ProduceResponse_v12,
    TxnProduce,
    produced,
)


def _compact(text: str | None) -> bytes:
    if text is None:
        return b"\x00"
    raw = text.encode()
    return bytes([len(raw) + 1]) + raw


def _encoded(request: object, struct_class: type) -> bytes:
    built = request.build(struct_class)  # type: ignore[attr-defined]
    encoded: bytes = built.encode()
    return encoded


def test_produce_puts_every_field_where_version_12_does() -> None:
    request = TxnProduce(
        "tx",
        {
            TopicPartition("b", 1): b"BATCH-B1",
            TopicPartition("a", 0): b"A0",
            TopicPartition("b", 0): b"B0",
        },
        timeout_ms=30_000,
    )
    assert _encoded(request, ProduceRequest_v12) == (
        _compact("tx")  # transactional_id
        + struct.pack(">h", -1)  # acks: all
        + struct.pack(">i", 30_000)  # timeout_ms
        + b"\x03"  # topics: two
        + _compact("b")
        + b"\x03"  # partitions: two, in the order given
        + struct.pack(">i", 1)
        + bytes([len(b"BATCH-B1") + 1])
        + b"BATCH-B1"
        + b"\x00"  # partition tags
        + struct.pack(">i", 0)
        + b"\x03B0\x00"
        + b"\x00"  # topic tags
        + _compact("a")
        + b"\x02"
        + struct.pack(">i", 0)
        + b"\x03A0\x00"
        + b"\x00"
        + b"\x00"  # request tags
    )
    assert request.required_acks == -1  # aiokafka's client waits for the answer


def test_the_produce_answer_gives_error_and_base_offset_per_partition() -> None:
    raw = (
        b"\x02"  # responses: one topic
        + _compact("b")
        + b"\x03"  # two partitions
        + struct.pack(">ihqqq", 0, 0, 1234, -1, 0)
        + b"\x01"  # record_errors: none
        + b"\x00"  # error_message: null
        + b"\x00"  # partition tags
        + struct.pack(">ihqqq", 1, 6, -1, -1, -1)  # NOT_LEADER_OR_FOLLOWER
        + b"\x02"  # one record error
        + struct.pack(">i", 3)
        + _compact("bad record")
        + b"\x00"
        + _compact("refused")
        + b"\x01\x00\x02xx"  # a tagged field (current leader) is skipped
        + b"\x00"  # topic tags
        + struct.pack(">i", 0)  # throttle_time_ms
        + b"\x00"
    )
    response = ProduceResponse_v12.decode(raw)
    assert produced(response) == {
        TopicPartition("b", 0): (0, 1234),
        TopicPartition("b", 1): (6, -1),
    }


def test_init_producer_id_asks_for_a_new_id_and_epoch() -> None:
    assert _encoded(InitProducerId("tx", 60_000), InitProducerIdRequest_v5) == (
        _compact("tx")
        + struct.pack(">i", 60_000)  # transaction_timeout_ms
        + struct.pack(">q", -1)  # producer_id: none yet
        + struct.pack(">h", -1)  # producer_epoch: none yet
        + b"\x00"
    )
    answer = InitProducerIdResponse_v5.decode(struct.pack(">ihqh", 0, 0, 77, 4) + b"\x00")
    assert (answer.error_code, answer.producer_id, answer.producer_epoch) == (0, 77, 4)


@pytest.mark.parametrize("committed", [True, False])
def test_end_txn_carries_the_outcome_and_its_answer_the_next_epoch(committed: bool) -> None:
    assert _encoded(EndTxn("tx", 77, 4, committed=committed), EndTxnRequest_v5) == (
        _compact("tx") + struct.pack(">qh?", 77, 4, committed) + b"\x00"
    )
    answer = EndTxnResponse_v5.decode(struct.pack(">ihqh", 0, 0, 77, 5) + b"\x00")
    assert (answer.error_code, answer.producer_id, answer.producer_epoch) == (0, 77, 5)


@pytest.mark.parametrize(
    ("request_", "struct_class", "too_old"),
    [
        (TxnProduce("tx", {}, 1), ProduceRequest_v12, (0, (3, 11))),
        (InitProducerId("tx", 1), InitProducerIdRequest_v5, (22, (0, 4))),
        (EndTxn("tx", 1, 0, committed=True), EndTxnRequest_v5, (26, (0, 4))),
    ],
)
def test_each_travels_with_a_flexible_header_and_only_in_its_version(
    request_: object, struct_class: type, too_old: tuple[int, tuple[int, int]]
) -> None:
    key, newest = too_old
    built = request_.prepare({key: (0, 13)})  # type: ignore[attr-defined]
    assert isinstance(built, struct_class)
    assert isinstance(built.build_request_header(1, "c"), RequestHeader_v2)
    with pytest.raises(NotImplementedError):
        request_.prepare({key: newest})  # type: ignore[attr-defined]
