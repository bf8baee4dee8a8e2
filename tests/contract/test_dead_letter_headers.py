"""The published dead-letter header schema describes the dead letters Cairn really writes.

Those include the original record's own headers and, on a record cut to fit, the
``cairn.dlq.truncated_from`` header the client guide documents.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from jsonschema import Draft202012Validator

from service.runtime.bad_input import fit_dead_letter
from service.runtime.records import dlq_record
from service.runtime.work import InputRecord, Origin
from service.wire import dlq
from service.wire.dlq import read_dlq_headers

REPO = Path(__file__).resolve().parents[2]
SCHEMA: dict[str, Any] = orjson.loads(
    (REPO / "contracts" / "schemas" / "dlq_headers.json").read_bytes()
)
TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _letter(value: bytes) -> InputRecord:
    headers = [("traceparent", TRACEPARENT), ("x-tenant", b"acme")]
    return InputRecord(Origin("cairn.commands", 3, 18211), b"s-1", value, headers, 0)


def _as_json(headers: list[tuple[str, bytes]]) -> dict[str, str]:
    return {name: value.decode() for name, value in headers}


def test_a_cut_dead_letter_with_the_original_headers_matches_the_schema() -> None:
    record = dlq_record("cairn.dlq", _letter(b"x" * 5000), "not JSON", "invalid_command")
    letter = fit_dead_letter(record, 2000)
    headers = _as_json(letter.headers)
    assert headers[dlq.DLQ_TRUNCATED_FROM] == "5000"
    assert headers["x-tenant"] == "acme"
    errors = [e.message for e in Draft202012Validator(SCHEMA).iter_errors(headers)]
    assert not errors
    read = read_dlq_headers(letter.headers)
    assert (read.truncated_from, read.source_offset) == ("5000", "18211")
    assert _as_json(read.to_headers()) == {
        name: value for name, value in headers.items() if name.startswith("cairn.dlq.")
    }


def test_a_whole_dead_letter_matches_the_schema_without_the_truncation_header() -> None:
    letter = fit_dead_letter(dlq_record("cairn.dlq", _letter(b"{"), "not JSON", "invalid_command"))
    headers = _as_json(letter.headers)
    assert dlq.DLQ_TRUNCATED_FROM not in headers
    assert Draft202012Validator(SCHEMA).is_valid(headers)
    assert read_dlq_headers(letter.headers).truncated_from is None


def test_the_schema_names_the_truncation_header_and_refuses_a_malformed_one() -> None:
    prop = SCHEMA["properties"][dlq.DLQ_TRUNCATED_FROM]
    assert prop["type"] == "string"
    assert dlq.DLQ_TRUNCATED_FROM not in SCHEMA["required"]
    assert SCHEMA["additionalProperties"] is not False
    letter = fit_dead_letter(dlq_record("cairn.dlq", _letter(b"{"), "not JSON", "invalid_command"))
    headers = {**_as_json(letter.headers), dlq.DLQ_TRUNCATED_FROM: "many"}
    assert not Draft202012Validator(SCHEMA).is_valid(headers)
