"""The committed contracts/ is what the code generates, and every example in it is valid.

Examples are checked twice, independently: against the published JSON Schema with the jsonschema
package, and through the pydantic models and the codec, which must give back the same JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from jsonschema import Draft202012Validator

from service.sessions.codec import decode_record, encode_state, record_dict
from service.wire.codec import decode_command, decode_control, decode_event, decode_result, encode
from service.wire.dlq import read_dlq_headers
from service.wire.errors import ERROR_CODES, WireError
from service.wire.export import drift
from service.wire.schemas import MESSAGE_MODELS, PART_MODELS
from service.wire.session_record import SessionStateRecord

CONTRACTS = Path(__file__).resolve().parents[2] / "contracts"
SCHEMAS = CONTRACTS / "schemas"
EXAMPLES = sorted((CONTRACTS / "examples").glob("*/*.json"))


def test_committed_contracts_are_what_the_code_generates() -> None:
    problems = drift(CONTRACTS)
    assert not problems, "contracts/ drifted; run `make contracts`:\n" + "\n".join(problems)


def test_one_schema_per_message_and_part_each_a_valid_2020_12_schema() -> None:
    names = {path.stem for path in SCHEMAS.glob("*.json")}
    assert names == set(MESSAGE_MODELS) | set(PART_MODELS)
    for path in SCHEMAS.glob("*.json"):
        schema = orjson.loads(path.read_bytes())
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        Draft202012Validator.check_schema(schema)


def test_every_message_and_every_error_code_has_an_example() -> None:
    folders = {path.parent.name for path in EXAMPLES}
    assert folders == set(MESSAGE_MODELS)
    codes = {
        orjson.loads(path.read_bytes())["error"]["code"]
        for path in EXAMPLES
        if path.parent.name == "agent_result" and path.stem.startswith("error-")
    }
    assert codes == set(ERROR_CODES)


def _schema_of(path: Path) -> dict[str, Any]:
    schema: dict[str, Any] = orjson.loads((SCHEMAS / f"{path.parent.name}.json").read_bytes())
    return schema


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_example_validates_against_its_json_schema(path: Path) -> None:
    validator = Draft202012Validator(_schema_of(path))
    errors = [
        f"{e.json_path}: {e.message}"
        for e in validator.iter_errors(orjson.loads(path.read_bytes()))
    ]
    assert not errors


def _headers_round_trip(value: bytes) -> Any:
    headers = [(name, text.encode()) for name, text in orjson.loads(value).items()]
    return {name: raw.decode() for name, raw in read_dlq_headers(headers).to_headers()}


def _state_round_trip(value: bytes) -> Any:
    record = SessionStateRecord.model_validate(orjson.loads(value))
    session = decode_record(encode_state(*decode_record(value)))
    assert record_dict(*session) == record.model_dump()
    return orjson.loads(encode(record))


ROUND_TRIPS: dict[str, Callable[[bytes], Any]] = {
    "invoke": lambda v: orjson.loads(encode(decode_command(v))),
    "resume": lambda v: orjson.loads(encode(decode_command(v))),
    "delete": lambda v: orjson.loads(encode(decode_command(v))),
    "history": lambda v: orjson.loads(encode(decode_command(v))),
    "fork": lambda v: orjson.loads(encode(decode_command(v))),
    "cancel": lambda v: orjson.loads(encode(decode_control(v))),
    "agent_result": lambda v: orjson.loads(encode(decode_result(v))),
    "dlq_headers": _headers_round_trip,
    "session_state": _state_round_trip,
}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_example_round_trips_through_the_model_and_codec_unchanged(path: Path) -> None:
    value = path.read_bytes()
    kind = path.parent.name
    decode = ROUND_TRIPS.get(kind) or (lambda v: orjson.loads(encode(decode_event(v))))
    assert decode(value) == orjson.loads(value)


def test_schemas_refuse_what_the_models_refuse() -> None:
    """Spot checks that the published schemas are as strict as the decoder on the fixed shapes."""
    invoke = orjson.loads((CONTRACTS / "examples" / "invoke" / "text-prompt.json").read_bytes())
    validator = Draft202012Validator(_schema_of(CONTRACTS / "examples" / "invoke" / "x.json"))
    bad = [
        {**invoke, "type": "resume"},
        {**invoke, "schema_version": 2},
        {k: v for k, v in invoke.items() if k != "type"},
        {**invoke, "prompt": [{"checkpointResume": {}}]},
        {**invoke, "prompt": [{"text": "a", "image": {}}]},
        {
            **invoke,
            "prompt": {
                "checkpointResume": {
                    "checkpoint": {
                        "position": "after_model",
                        "cycle_index": 0,
                        "schema_version": 1.0,
                    }
                }
            },
        },
        {**invoke, "unknown": 1},
    ]
    for value in bad:
        assert not validator.is_valid(value), value
        with pytest.raises(WireError):
            decode_command(orjson.dumps(value))
