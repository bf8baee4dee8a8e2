"""Dead letters always fit one producer request: cut when needed, whole otherwise."""

from __future__ import annotations

from service.runtime.bad_input import fit_dead_letter
from service.runtime.records import dlq_record
from service.runtime.work import InputRecord, Origin
from service.wire.dlq import DLQ_TRUNCATED_FROM, read_dlq_headers


def _letter(value: bytes, headers: list[tuple[str, bytes]] | None = None) -> InputRecord:
    return InputRecord(Origin("cmds", 3, 42), b"key", value, headers or [("h", b"v")], 0)


def test_a_small_dead_letter_is_kept_whole() -> None:
    out = dlq_record("dlq", _letter(b"not json"), "bad", "invalid_command")
    assert out.value == b"not json"
    assert out.headers[0] == ("h", b"v")
    assert DLQ_TRUNCATED_FROM not in dict(out.headers)


def test_a_large_dead_letter_is_cut_to_the_budget_with_its_length_noted() -> None:
    out = fit_dead_letter(dlq_record("dlq", _letter(b"x" * 5000), "bad", "invalid_command"), 2000)
    headers = dict(out.headers)
    assert headers[DLQ_TRUNCATED_FROM] == b"5000"
    assert out.value is not None and 0 < len(out.value) < 2000
    assert out.value == b"x" * len(out.value)
    assert headers["h"] == b"v"
    assert read_dlq_headers(out.headers).source_offset == "42"


def test_huge_original_headers_give_way_to_cairns() -> None:
    letter = _letter(b"v", [("big", b"y" * 5000)])
    out = fit_dead_letter(dlq_record("dlq", letter, "bad", "invalid_command"), 2000)
    names = [name for name, _ in out.headers]
    assert "big" not in names
    assert read_dlq_headers(out.headers).source_topic == "cmds"
    assert dict(out.headers)[DLQ_TRUNCATED_FROM] == b"1"
