"""The ``tool_outcome_unknown`` shapes: the published schemas, the wire models and the engine agree.

Every reason in the examples is the engine's and matches its schema; every answer in the examples
is one the engine takes, and what the engine refuses the schema and the model refuse too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from service.agent.outcomes import (
    OUTCOME_UNKNOWN,
    answer_problem,
    is_outcome_interrupt,
    outcome_reason,
)
from service.wire.outcomes import ToolOutcomeAnswer, ToolOutcomeUnknownReason

CONTRACTS = Path(__file__).resolve().parents[2] / "contracts"
EXAMPLES = CONTRACTS / "examples"


def _schema(name: str) -> Draft202012Validator:
    return Draft202012Validator(orjson.loads((CONTRACTS / "schemas" / f"{name}.json").read_bytes()))


REASON = _schema("tool_outcome_unknown_reason")
ANSWER = _schema("tool_outcome_answer")


def _interrupts(value: Any) -> list[dict[str, Any]]:
    """Every interrupt object anywhere in an example (results, events, session states)."""
    if isinstance(value, dict):
        found = [value] if {"id", "name", "reason", "response"} <= set(value) else []
        return found + [i for v in value.values() for i in _interrupts(v)]
    if isinstance(value, list):
        return [i for v in value for i in _interrupts(v)]
    return []


def _outcome_reasons() -> list[tuple[str, Any]]:
    found = []
    for path in sorted(EXAMPLES.glob("*/*.json")):
        for interrupt in _interrupts(orjson.loads(path.read_bytes())):
            if is_outcome_interrupt(str(interrupt["id"])):
                assert interrupt["name"] == OUTCOME_UNKNOWN, path
                found.append((f"{path.parent.name}/{path.stem}", interrupt["reason"]))
    return found


def _outcome_answers() -> list[tuple[str, Any]]:
    found = []
    for path in sorted((EXAMPLES / "resume").glob("*.json")):
        for item in orjson.loads(path.read_bytes())["resume"]:
            body = item.get("interruptResponse") if isinstance(item, dict) else None
            if body and is_outcome_interrupt(body["interruptId"]):
                found.append((path.stem, body["response"]))
    return found


REASONS = _outcome_reasons()
ANSWERS = _outcome_answers()


def test_the_examples_show_the_pause_and_every_kind_of_answer() -> None:
    assert [name for name, _ in REASONS] == ["agent_result/interrupt-tool-outcome-unknown"]
    assert sorted(key for _, answer in ANSWERS for key in answer) == ["fail", "result", "retry"]


@pytest.mark.parametrize(("name", "reason"), REASONS, ids=[n for n, _ in REASONS])
def test_every_example_reason_satisfies_its_schema_and_model(name: str, reason: Any) -> None:
    assert not [e.message for e in REASON.iter_errors(reason)]
    assert ToolOutcomeUnknownReason.model_validate(reason).model_dump(mode="json") == reason


def test_the_reason_schema_requires_exactly_what_the_engine_writes() -> None:
    use = {"toolUseId": "t1", "name": "pay_invoice", "input": {"invoice": "A-1"}}
    reason = outcome_reason(use, {"at": 1767225661.25, "instance": "cairn-7d9f-2:4411"}, "s:t1")
    assert set(REASON.schema["required"]) == set(reason)
    assert REASON.is_valid(reason)
    # A reason without its start time could not tell the caller when the tool ran.
    assert not REASON.is_valid({k: v for k, v in reason.items() if k != "started_at"})


@pytest.mark.parametrize(("name", "answer"), ANSWERS, ids=[n for n, _ in ANSWERS])
def test_every_example_answer_is_accepted_by_schema_model_and_engine(
    name: str, answer: Any
) -> None:
    assert not [e.message for e in ANSWER.iter_errors(answer)]
    ToolOutcomeAnswer.model_validate(answer)
    assert answer_problem(answer) is None


GOOD = [
    {"result": {"content": [{"text": "paid"}]}},
    {"result": {"content": [], "status": "error"}},
    {"retry": True},
    {"fail": "the bank says no"},
]
BAD = [
    {},
    {"retry": True, "fail": "both"},
    {"retry": False},
    {"retry": 1},
    {"fail": ""},
    {"fail": "   "},
    {"result": {"status": "success"}},
    {"result": {"content": [{"text": "paid"}], "extra": 1}},
    {"result": {"content": [{"text": "paid"}], "status": "done"}},
    {"result": {"content": [{"text": 5}]}},
    {"result": {"content": [{"text": "a", "json": {}}]}},
    {"results": {"content": []}},
    "retry",
    None,
    [{"retry": True}],
]


@pytest.mark.parametrize("answer", GOOD, ids=repr)
def test_the_three_shapes_are_accepted_everywhere(answer: Any) -> None:
    assert ANSWER.is_valid(answer)
    ToolOutcomeAnswer.model_validate(answer)
    assert answer_problem(answer) is None


@pytest.mark.parametrize("answer", BAD, ids=repr)
def test_what_the_engine_refuses_the_schema_and_the_model_refuse(answer: Any) -> None:
    assert answer_problem(answer) is not None
    assert not ANSWER.is_valid(answer)
    with pytest.raises(ValidationError):
        ToolOutcomeAnswer.model_validate(answer)
