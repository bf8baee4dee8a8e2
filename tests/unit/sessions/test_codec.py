"""Session-state codec: lossless round trip, compression, versions and upcasters, bad bytes."""

from __future__ import annotations

import zlib
from typing import Any

import orjson
import pytest

from service.agent.state import SESSION_STATE_VERSION, Inflight, PendingBatch, SessionState
from service.agent.types import Checkpoint, Interrupt
from service.sessions.codec import StateDecodeError, decode_record, decode_state, encode_state
from service.sessions.delivery import Delivery
from service.sessions.upcasters import StateVersionError, upcast


def full_state() -> SessionState:
    tool_use = {"toolUse": {"toolUseId": "t1", "name": "echo", "input": {"text": "ü ✓"}}}
    return SessionState(
        session_id="s-codec",
        agent="tester",
        messages=[
            {"role": "user", "content": [{"text": "hi"}]},
            {"role": "assistant", "content": [{"text": "calling"}, tool_use]},
        ],
        agent_state={"n": 1, "nested": {"list": [1, 2.5, None, True]}},
        checkpoint=Checkpoint("after_model", 2),
        cycle_index=2,
        pending=PendingBatch(
            assistant_message={"role": "assistant", "content": [tool_use]},
            results={"t0": {"toolResult": {"toolUseId": "t0", "status": "success", "content": []}}},
            interrupts=[Interrupt("v1:tool_call:t1:x", "ok", {"why": 1}, None)],
        ),
        inflight=Inflight("cmd-1", "after_model", 2, False),
        turn_metrics={"invocations": 2, "cycles": 3, "duration_ms": 1.25},
        turn_started_at=1700000000.123456,
        turn_checkpointing=True,
        turn_limits={"max_cycles": 4, "max_tokens": None, "deadline_s": 1.5},
    )


def test_round_trip_is_lossless() -> None:
    state = full_state()
    assert decode_state(encode_state(state)) == state
    empty = SessionState(session_id="e")
    assert decode_state(encode_state(empty)) == empty


def test_delivery_records_travel_beside_the_state_and_stay_out_of_it() -> None:
    state = full_state()
    delivery = Delivery(
        ("a", "b"), cancelled_before_ms=100, inflight_published_ms=90, answered_through=(7, 95)
    )
    data = encode_state(state, delivery)
    assert decode_record(data) == (state, delivery)
    assert decode_state(data) == state
    assert "applied_commands" not in state.to_dict()
    assert decode_record(encode_state(state)) == (state, Delivery())
    record = orjson.loads(encode_state(state, Delivery(), compress_above=1 << 30))
    assert record["applied_commands"] == []
    assert "cancelled_before_ms" not in record and "inflight_published_ms" not in record
    assert "answered_through" not in record
    with pytest.raises(StateDecodeError, match="delivery"):
        decode_record(orjson.dumps(record | {"applied_commands": 5}))
    for bad in ([1], [1, "2"], 3):
        with pytest.raises(StateDecodeError, match="delivery"):
            decode_record(orjson.dumps(record | {"answered_through": bad}))


def test_small_states_are_plain_json_and_large_ones_compressed() -> None:
    small = encode_state(SessionState(session_id="e"))
    assert small[:1] == b"{"
    big_state = full_state()
    big_state.messages.extend(
        {"role": "user" if i % 2 else "assistant", "content": [{"text": "word " * 50}]}
        for i in range(40)
    )
    big = encode_state(big_state)
    assert big[:1] == b"z"
    assert len(big) < len(orjson.dumps(big_state.to_dict())) / 4
    assert decode_state(big) == big_state


def test_plain_json_written_by_hand_is_readable() -> None:
    data = orjson.dumps({"session_id": "hand", "messages": []})
    state = decode_state(data)
    assert state.session_id == "hand" and state.schema_version == SESSION_STATE_VERSION


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"z" + b"garbage",
        b"[1, 2]",
        b'{"no_session_id": true}',
        b"z" + zlib.compress(b"[]"),
    ],
)
def test_unreadable_bytes_raise_a_decode_error(data: bytes) -> None:
    with pytest.raises(StateDecodeError):
        decode_state(data)


@pytest.mark.parametrize("version", [SESSION_STATE_VERSION + 1, 0, "1", True])
def test_unknown_versions_are_rejected(version: Any) -> None:
    data = orjson.dumps({"schema_version": version, "session_id": "v"})
    with pytest.raises(StateVersionError):
        decode_state(data)


def test_upcasters_run_in_order_up_to_the_current_version() -> None:
    def one_to_two(data: dict[str, Any]) -> dict[str, Any]:
        data["messages"] = data.pop("history")
        return data

    def two_to_three(data: dict[str, Any]) -> dict[str, Any]:
        data["agent"] = data["agent"].upper()
        return data

    old = {"schema_version": 1, "session_id": "u", "history": [], "agent": "a"}
    upcasted = upcast(old, current=3, upcasters={1: one_to_two, 2: two_to_three})
    assert upcasted == {"schema_version": 3, "session_id": "u", "messages": [], "agent": "A"}
    with pytest.raises(StateVersionError):
        upcast({"schema_version": 1, "history": []}, current=3, upcasters={1: one_to_two})


def test_interrupted_flag_survives_the_codec() -> None:
    state = decode_state(encode_state(full_state()))
    assert state.interrupted
    assert state.pending is not None and state.pending.interrupts[0].reason == {"why": 1}
