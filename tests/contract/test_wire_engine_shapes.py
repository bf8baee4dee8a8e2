"""The wire models accept exactly what the engine produces, and re-encode it unchanged."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from service.agent import errors as engine_errors
from service.agent.state import SessionState
from service.agent.types import AgentResult, Checkpoint, ErrorInfo, Interrupt
from service.sessions.codec import record_dict
from service.sessions.delivery import Delivery
from service.wire.codec import decode_event, decode_result, encode_event, encode_result
from service.wire.errors import ERROR_CODES, WireError
from service.wire.events import EVENT_TYPES
from service.wire.pauses import Checkpoint as WireCheckpoint
from service.wire.pauses import Interrupt as WireInterrupt
from service.wire.results import deleted_result, error_record, result_record
from service.wire.schemas import message_schema
from service.wire.session_record import SessionStateRecord
from tests.contract.session_scenario import PROMPT, SESSION, continuation, step, support_agent


def _engine_codes() -> set[str]:
    found: set[str] = set()
    pending: list[type[engine_errors.EngineError]] = [engine_errors.EngineError]
    while pending:
        cls = pending.pop()
        found.add(cls.code)
        pending.extend(cls.__subclasses__())
    return found


def test_error_codes_are_the_engines_plus_none_invented() -> None:
    assert _engine_codes() == set(ERROR_CODES)


@pytest.fixture(scope="module")
def scenario() -> tuple[list[AgentResult], list[SessionState]]:
    """Every result and state of one full turn (4 checkpoints, 1 interrupt, end_turn)."""

    async def run() -> tuple[list[AgentResult], list[SessionState]]:
        agent = support_agent()
        results: list[AgentResult] = []
        states: list[SessionState] = []
        state = SessionState(session_id=SESSION)
        value: Any = PROMPT
        for index in range(10):
            result, state = await step(agent, state, f"cmd-{index}", value)
            results.append(result)
            states.append(state)
            if result.stop_reason not in ("checkpoint", "interrupt"):
                break
            value = continuation(result)
        return results, states

    return asyncio.run(run())


def test_the_scenario_covers_every_pause(scenario: tuple[list[AgentResult], list[Any]]) -> None:
    reasons = [r.stop_reason for r in scenario[0]]
    assert reasons == [
        "checkpoint",
        "checkpoint",
        "checkpoint",
        "interrupt",
        "checkpoint",
        "end_turn",
    ]


def test_every_engine_result_is_a_valid_record_and_round_trips(
    scenario: tuple[list[AgentResult], list[SessionState]],
) -> None:
    for index, result in enumerate(scenario[0]):
        record = result_record(
            result, session_id=SESSION, command_id=f"cmd-{index}", metadata={"i": index}
        )
        value = encode_result(record)
        body = orjson.loads(value)
        expected = {**result.to_dict(), "schema_version": 1, "session_id": SESSION}
        expected.update(command_id=f"cmd-{index}", metadata={"i": index})
        assert body == orjson.loads(orjson.dumps(expected))
        assert decode_result(value) == record


def test_every_engine_result_and_state_satisfies_the_published_schemas(
    scenario: tuple[list[AgentResult], list[SessionState]],
) -> None:
    """The hot path re-checks written blocks only lightly; the full schemas must still hold."""
    results = Draft202012Validator(message_schema("agent_result"))
    states = Draft202012Validator(message_schema("session_state"))
    for index, result in enumerate(scenario[0]):
        record = result_record(result, session_id=SESSION, command_id=f"cmd-{index}")
        errors = list(results.iter_errors(orjson.loads(encode_result(record))))
        assert not errors, errors[0].message
    for state in scenario[1]:
        stored = orjson.loads(orjson.dumps(record_dict(state, Delivery(applied=("c1",)))))
        errors = list(states.iter_errors(stored))
        assert not errors, errors[0].message


WRITTEN_WHEN_SET = {"metadata_truncated", "cancel", "deleted", "version", "forked_from", "history"}
"""Result fields absent unless they say something: a truncated echo, a cancel's or a delete's
report, the session's version, a fork's origin, a history page."""


def test_fast_encoding_equals_the_pydantic_dump(
    scenario: tuple[list[AgentResult], list[SessionState]],
) -> None:
    for index, result in enumerate(scenario[0]):
        record = result_record(result, session_id=SESSION, command_id=f"cmd-{index}")
        assert encode_result(record) == orjson.dumps(record.model_dump(exclude_unset=True))
        # Every field is written, except those written only where they apply.
        assert encode_result(record) == orjson.dumps(record.model_dump(exclude=WRITTEN_WHEN_SET))


def test_a_deletes_result_carries_its_report_and_nothing_else() -> None:
    record = deleted_result(
        session_id="s",
        command_id="d",
        existed=True,
        records=3,
        stopped="c1",
        skipped=("c2", "c3"),
        metadata={"m": 1},
    )
    value = encode_result(record)
    body = orjson.loads(value)
    assert not list(Draft202012Validator(message_schema("agent_result")).iter_errors(body))
    assert body["deleted"] == {
        "existed": True,
        "records": 3,
        "stopped": "c1",
        "skipped": ["c2", "c3"],
    }
    assert {k: body[k] for k in ("stop_reason", "message", "checkpoint", "interrupts")} == {
        "stop_reason": "end_turn",
        "message": None,
        "checkpoint": None,
        "interrupts": None,
    }
    assert (body["metrics"], body["state"], body["error"], body["metadata"]) == (
        {},
        {},
        None,
        {"m": 1},
    )
    assert "cancel" not in body and "metadata_truncated" not in body
    assert decode_result(value) == record
    nothing = deleted_result(
        session_id="s", command_id="d", existed=False, records=0, stopped=None, skipped=[],
        metadata=None,
    )  # fmt: skip
    assert orjson.loads(encode_result(nothing))["deleted"] == {
        "existed": False,
        "records": 0,
        "stopped": None,
        "skipped": [],
    }
    with pytest.raises(ValidationError, match="records"):
        deleted_result(
            session_id="s", command_id="d", existed=True, records=-1, stopped=None, skipped=[],
            metadata=None,
        )  # fmt: skip
    negative = {**body, "deleted": {**body["deleted"], "records": -1}}
    assert not Draft202012Validator(message_schema("agent_result")).is_valid(negative)


def test_every_engine_state_matches_the_session_record(
    scenario: tuple[list[AgentResult], list[SessionState]],
) -> None:
    delivery = Delivery(applied=("c1",), cancelled_before_ms=5)
    for state in scenario[1]:
        data = orjson.loads(orjson.dumps(record_dict(state, delivery)))
        assert SessionStateRecord.model_validate(data).model_dump() == data


def test_engine_shapes_of_checkpoint_and_interrupt_are_accepted() -> None:
    for position in ("after_model", "after_tools"):
        cp = Checkpoint(position=position, cycle_index=3).to_dict()  # type: ignore[arg-type]
        assert WireCheckpoint.model_validate(cp).model_dump() == cp
    interrupt = Interrupt(id="v1:before_tools:x", name="approve", reason={"a": [1]}).to_dict()
    assert WireInterrupt.model_validate(interrupt).model_dump() == interrupt


def test_session_record_refuses_fields_the_engine_does_not_write() -> None:
    data = SessionState(session_id="s").to_dict()
    with pytest.raises(ValidationError, match="extra"):
        SessionStateRecord.model_validate({**data, "surprise": 1})


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"stop_reason": "checkpoint"}, "checkpoint is set exactly when"),
        (
            {"checkpoint": {"position": "after_model", "cycle_index": 0, "schema_version": "1.0"}},
            "checkpoint is set exactly when",
        ),
        ({"stop_reason": "interrupt"}, "interrupts are set exactly when"),
        ({"stop_reason": "error"}, "error is required when"),
        ({"interrupts": []}, "at least 1 item"),
        ({"error": {"code": "teapot", "message": "x"}}, "error.code"),
        ({"stop_reason": "finished"}, "stop_reason"),
    ],
)
def test_results_whose_fields_disagree_are_refused(changes: dict[str, Any], problem: str) -> None:
    body = error_record(session_id="s", command_id="c", code="internal", message="x").model_dump()
    body.update({"stop_reason": "end_turn", "error": None})
    body.update(changes)
    with pytest.raises(WireError) as caught:
        decode_result(orjson.dumps(body))
    assert problem in caught.value.reason


def test_engine_error_results_carry_their_code() -> None:
    result = AgentResult(stop_reason="error", message=None, error=ErrorInfo("model_error", "503"))
    record = result_record(result, session_id="s", command_id="c")
    assert orjson.loads(encode_result(record))["error"] == {"code": "model_error", "message": "503"}
    assert record.metadata == {}


def test_results_from_a_newer_minor_version_are_read_tolerantly() -> None:
    body = error_record(session_id="s", command_id="c", code="internal", message="x").model_dump()
    record = decode_result(orjson.dumps({**body, "added_later": {"x": 1}}))
    assert record.error is not None and record.error.code == "internal"


def test_events_round_trip_and_refuse_unknown_types() -> None:
    for kind, model in EVENT_TYPES.items():
        assert model.model_fields["type"].default == kind
    event = EVENT_TYPES["tool_finished"](
        session_id="s", command_id="c", seq=4, tool_use_id="t", name="n", status="error"
    )
    assert decode_event(encode_event(event)) == event
    with pytest.raises(WireError, match="unknown message type 'tool_exploded'"):
        decode_event(orjson.dumps({**event.model_dump(), "type": "tool_exploded"}))
    with pytest.raises(WireError, match="seq: Input should be greater than or equal to 0"):
        decode_event(orjson.dumps({**event.model_dump(), "seq": -1}))


def test_encoding_a_value_that_is_not_json_raises_wire_error() -> None:
    result = AgentResult(stop_reason="end_turn", message=None, state={"when": object()})
    with pytest.raises(WireError, match="not JSON"):
        encode_result(result_record(result, session_id="s", command_id="c"))
