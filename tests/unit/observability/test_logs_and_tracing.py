"""JSON log lines carry the session context; traceparent headers parse and propagate."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Iterator

import orjson
import pytest

from service.observability import tracing
from service.observability.logs import configure_logging, log_context
from service.observability.tracing import (
    TraceContext,
    from_headers,
    parse_traceparent,
    span,
)

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    level = logging.getLogger().level
    handler = configure_logging("DEBUG", stream=stream)
    yield stream
    logging.getLogger().removeHandler(handler)
    logging.getLogger().setLevel(level)


def _lines(stream: io.StringIO) -> list[dict[str, object]]:
    """Every line must be JSON; only this test's logger is kept (asyncio logs at DEBUG too)."""
    parsed = [orjson.loads(line) for line in stream.getvalue().splitlines()]
    return [line for line in parsed if line["logger"] == "cairn.test"]


async def test_each_line_is_one_json_object_with_context_tags(captured: io.StringIO) -> None:
    log = logging.getLogger("cairn.test")

    async def work(session: str) -> None:
        with log_context(session_id=session, command_id=f"cmd-{session}"):
            await asyncio.sleep(0)
            log.info("session=<%s> | step done", session)

    await asyncio.gather(work("a"), work("b"))
    log.info("outside")
    log.warning("explicit", extra={"session_id": "x", "partition": 3})
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        log.exception("failed")

    lines = _lines(captured)
    assert len(lines) == 5
    by_message = {line["message"]: line for line in lines}
    assert by_message["session=<a> | step done"]["session_id"] == "a"
    assert by_message["session=<a> | step done"]["command_id"] == "cmd-a"
    assert by_message["session=<b> | step done"]["command_id"] == "cmd-b"
    assert "session_id" not in by_message["outside"]
    assert by_message["explicit"]["session_id"] == "x"
    assert by_message["explicit"]["partition"] == 3
    assert by_message["explicit"]["level"] == "warning"
    assert "ValueError: bad" in str(by_message["failed"]["exception"])


def test_unserialisable_extra_is_written_as_text(captured: io.StringIO) -> None:
    logging.getLogger("cairn.test").info("odd", extra={"thing": object()})
    (line,) = _lines(captured)
    assert str(line["thing"]).startswith("<object object")


def test_context_is_restored_after_the_block() -> None:
    from service.observability.logs import current_context

    with log_context(session_id="s1"):
        with log_context(command_id="c1"):
            assert current_context() == {"session_id": "s1", "command_id": "c1"}
        assert current_context() == {"session_id": "s1"}
    assert current_context() == {}


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        b"\xff\xfe",
    ],
)
def test_invalid_traceparent_is_ignored(value: str | bytes | None) -> None:
    assert parse_traceparent(value) is None


def test_valid_traceparent_and_future_versions_parse() -> None:
    ctx = parse_traceparent(VALID.encode())
    assert ctx == TraceContext("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "01")
    assert ctx.sampled
    assert ctx.traceparent == VALID
    future = parse_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what")
    assert future is not None
    assert not future.sampled


def test_headers_round_trip_with_a_child_span() -> None:
    headers = [("other", b"x"), ("TraceParent", VALID.encode()), ("tracestate", b"vendor=1")]
    parent = from_headers(headers)
    assert parent is not None
    assert parent.tracestate == "vendor=1"
    with span("cairn.invoke", parent, use_otel=False) as child:
        assert child.trace_id == parent.trace_id
        assert child.span_id != parent.span_id
        out = dict(child.headers())
    again = from_headers(list(out.items()))
    assert again == child
    assert from_headers(None) is None
    assert from_headers([("other", b"x")]) is None


def test_a_command_without_trace_starts_a_new_one() -> None:
    with span("cairn.invoke", None, use_otel=False) as root:
        assert parse_traceparent(root.traceparent) == root


def test_opentelemetry_api_without_sdk_still_yields_a_child() -> None:
    pytest.importorskip("opentelemetry.trace")
    assert tracing._otel is not None
    parent = parse_traceparent(VALID)
    assert parent is not None
    with span("cairn.invoke", parent, attributes={"cairn.session_id": "s"}) as child:
        assert child.trace_id == parent.trace_id
        assert child.span_id != parent.span_id
    with span("cairn.invoke", None) as root:
        assert len(root.trace_id) == 32


def test_without_any_provider_the_api_getter_is_not_called_per_span(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The API's getter reads the environment at every call until a provider is set: with none
    # set and none named by the environment, a span does not ask it.
    trace_api = pytest.importorskip("opentelemetry.trace")
    assert trace_api._TRACER_PROVIDER is None

    def refuse() -> None:
        raise AssertionError("the provider was looked up")

    monkeypatch.setattr(trace_api, "get_tracer_provider", refuse)
    parent = parse_traceparent(VALID)
    assert parent is not None
    with span("cairn.invoke", parent) as child:
        assert child.trace_id == parent.trace_id
    assert tracing.current_span() is tracing.NO_SPAN


def test_without_an_sdk_provider_no_opentelemetry_span_is_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The API alone hands out spans that record nothing but cost as much as an engine step:
    # without an SDK provider none is started, for the command or the engine.
    trace_api = pytest.importorskip("opentelemetry.trace")
    assert isinstance(trace_api.get_tracer_provider(), trace_api.ProxyTracerProvider)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a tracer was asked for a span")

    monkeypatch.setattr(trace_api.ProxyTracerProvider, "get_tracer", refuse)
    monkeypatch.setattr(tracing._otel, "_provider", None)
    parent = parse_traceparent(VALID)
    assert parent is not None
    with span("cairn.invoke", parent) as child:
        assert child.trace_id == parent.trace_id
        assert tracing.current_span() is tracing.NO_SPAN
    with tracing.engine_tracer().span("cairn.model", {}) as engine_span:
        assert engine_span is tracing.NO_SPAN
