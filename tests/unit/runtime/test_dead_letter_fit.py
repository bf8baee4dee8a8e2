"""Dead letters always fit one producer request: cut when needed, whole otherwise."""

from __future__ import annotations

from service.runtime.bad_input import fit_dead_letter
from service.runtime.records import dlq_record
from service.runtime.work import InputRecord, Origin
from service.wire.dlq import (
    DLQ_CODE,
    DLQ_HEADERS_DROPPED,
    DLQ_REASON,
    DLQ_TRUNCATED_FROM,
    read_dlq_headers,
)


def _letter(value: bytes, headers: list[tuple[str, bytes | None]] | None = None) -> InputRecord:
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


def test_huge_original_headers_give_way_to_cairns_and_the_value_is_not_called_cut() -> None:
    letter = _letter(b"v", [("big", b"y" * 5000)])
    out = fit_dead_letter(dlq_record("dlq", letter, "bad", "invalid_command"), 2000)
    names = [name for name, _ in out.headers]
    assert "big" not in names
    assert out.value == b"v"
    read = read_dlq_headers(out.headers)
    assert (read.source_topic, read.headers_dropped, read.truncated_from) == ("cmds", "1", None)


def test_a_small_value_with_a_megabyte_of_headers_keeps_the_value_and_the_first_headers() -> None:
    originals = [(f"h{i}", b"y" * 100_000) for i in range(10)]
    out = dlq_record("dlq", _letter(b"not json at all", originals), "bad", "invalid_command")
    assert out.value == b"not json at all"
    assert out.headers[:9] == originals[:9]
    headers = dict(out.headers)
    assert DLQ_TRUNCATED_FROM not in headers
    assert headers[DLQ_HEADERS_DROPPED] == b"1"
    assert read_dlq_headers(out.headers).source_offset == "42"


def test_a_cut_value_keeps_the_original_headers_that_fit_and_names_both_losses() -> None:
    originals = [("small", b"s"), ("big", b"y" * 1600), ("after", b"a")]
    out = fit_dead_letter(
        dlq_record("dlq", _letter(b"x" * 5000, originals), "bad", "internal"), 2000
    )
    assert [name for name, _ in out.headers][:1] == ["small"]
    assert "after" not in dict(out.headers)
    read = read_dlq_headers(out.headers)
    assert (read.truncated_from, read.headers_dropped) == ("5000", "2")
    assert out.value is not None and 0 < len(out.value) < 2000


def test_original_cairn_dlq_headers_are_kept_first_and_never_read_as_cairns() -> None:
    # A replayed dead letter: its old headers, a cut included, travel as the record's own.
    old = [(DLQ_CODE, b"unknown_agent"), (DLQ_TRUNCATED_FROM, b"77"), (DLQ_REASON, b"old")]
    out = dlq_record("dlq", _letter(b"not json", old), "bad", "invalid_command")
    assert out.headers[:3] == old
    read = read_dlq_headers(out.headers)
    assert (read.code, read.reason, read.truncated_from) == ("invalid_command", "bad", None)


def test_headers_without_a_value_are_kept_as_they_came_whole_or_cut() -> None:
    originals: list[tuple[str, bytes | None]] = [("empty", None), ("big", b"y" * 1600), ("z", None)]
    whole = dlq_record("dlq", _letter(b"not json", originals), "bad", "invalid_command")
    assert whole.headers[:3] == originals
    cut = fit_dead_letter(
        dlq_record("dlq", _letter(b"x" * 5000, originals), "bad", "invalid_command"), 2000
    )
    assert cut.headers[0] == ("empty", None)
    read = read_dlq_headers(cut.headers)
    assert (read.truncated_from, read.headers_dropped) == ("5000", "2")
