"""Spans with OpenTelemetry's SDK, read back from its in-memory exporter: one per command, per
model call and per tool call, continuing the trace of the command record's ``traceparent``, with
their attributes and their errors. And without OpenTelemetry, nothing of it is imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util._once import Once

from service.agent.definition import AgentDefinition
from service.agent.errors import ModelError
from service.agent.loop import Invocation, run_invocation
from service.agent.state import SessionState
from service.agent.tools import tool
from service.agent.types import Usage
from service.observability import trace_export
from service.observability.trace_export import TracingSetupError, configure_tracing
from service.observability.tracing import engine_tracer, parse_traceparent, span
from service.providers.scripted import ScriptedModel, ToolCall, tool_calls
from service.runtime.answers import Answers
from service.runtime.cancels import CancelDesk
from service.runtime.command_path import CommandPath
from service.runtime.invoker import Invoker
from service.runtime.records import ParsedCommand
from service.runtime.work import CommandWork, InputRecord, Origin, Outcome
from service.settings import TopicSettings
from tests.support.session_records import writer_for

REPO = Path(__file__).resolve().parents[3]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"
TOPICS = TopicSettings()


def _reset_global_provider() -> None:
    # OpenTelemetry lets a process set its provider once; its own tests reset it like this.
    trace_api._TRACER_PROVIDER_SET_ONCE = Once()
    trace_api._TRACER_PROVIDER = None


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset_global_provider()
    trace_api.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        _reset_global_provider()


@tool
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first
        b: the second
    """
    return a + b


@tool
def boom() -> str:
    """Always fails."""
    raise RuntimeError("the tool broke")


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for this one")


@tool(inline=True)
def garbled() -> str:
    """Raises an exception that cannot be turned into text."""
    raise Unprintable


def _by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for one in spans:
        found.setdefault(one.name, []).append(one)
    return found


def _hex(value: int, width: int) -> str:
    return f"{value:0{width}x}"


async def test_engine_spans_nest_under_the_command_and_continue_its_trace(
    exported: InMemorySpanExporter,
) -> None:
    model = ScriptedModel(
        [tool_calls(ToolCall("add", {"a": 17, "b": 23}), ToolCall("boom")), "forty"],
        usage=Usage(11, 7),
    )
    agent = AgentDefinition(name="calc", model=model, tools=[add, boom])
    parent = parse_traceparent(TRACEPARENT)
    with span("cairn.command", parent) as command:
        events = [
            e
            async for e in run_invocation(
                agent, SessionState("s1"), Invocation("c1", "go"), tracer=engine_tracer()
            )
        ]
    assert type(events[-1]).__name__ == "Stopped"

    spans = _by_name(exported.get_finished_spans())
    assert sorted(spans) == [
        "cairn.command",
        "chat ScriptedModel",
        "execute_tool add",
        "execute_tool boom",
    ]
    [root] = spans["cairn.command"]
    # The command's span continues the record's trace, parented by the span that sent it.
    assert _hex(root.context.trace_id, 32) == TRACE_ID
    assert root.parent is not None and root.parent.is_remote
    assert _hex(root.parent.span_id, 16) == PARENT_SPAN_ID
    assert root.kind is SpanKind.CONSUMER
    assert _hex(root.context.span_id, 16) == command.span_id  # what goes on the outputs

    children = [
        *spans["chat ScriptedModel"],
        *spans["execute_tool add"],
        *spans["execute_tool boom"],
    ]
    for child in children:
        assert child.context.trace_id == root.context.trace_id
        assert child.parent is not None and child.parent.span_id == root.context.span_id

    first, second = spans["chat ScriptedModel"]
    assert first.attributes is not None and second.attributes is not None
    assert first.attributes["gen_ai.operation.name"] == "chat"
    assert first.attributes["gen_ai.request.model"] == "ScriptedModel"
    assert first.attributes["cairn.session_id"] == "s1"
    assert first.attributes["cairn.agent"] == "calc"
    assert first.attributes["gen_ai.response.finish_reasons"] == ("tool_use",)
    assert first.attributes["gen_ai.usage.input_tokens"] == 11
    assert first.attributes["gen_ai.usage.output_tokens"] == 7
    assert second.attributes["gen_ai.response.finish_reasons"] == ("end_turn",)
    assert first.end_time is not None and second.start_time is not None
    assert first.end_time <= second.start_time

    [ok] = spans["execute_tool add"]
    assert ok.attributes is not None
    assert ok.attributes["gen_ai.tool.name"] == "add"
    assert ok.attributes["gen_ai.tool.call.id"] == "tooluse_1_0"
    assert ok.attributes["cairn.tool.status"] == "success"
    assert ok.attributes["cairn.tool.attempts"] == 1
    assert ok.status.status_code is StatusCode.UNSET

    [failed] = spans["execute_tool boom"]
    assert failed.attributes is not None
    assert failed.attributes["cairn.tool.status"] == "error"
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "Error: RuntimeError - the tool broke"
    [event] = failed.events
    assert event.name == "exception"
    assert event.attributes is not None
    assert event.attributes["exception.message"] == "the tool broke"


async def test_a_failed_model_call_is_an_error_span(exported: InMemorySpanExporter) -> None:
    agent = AgentDefinition(name="down", model=ScriptedModel([ModelError("overloaded")]))
    async for _ in run_invocation(
        agent, SessionState("s2"), Invocation("c2", "go"), tracer=engine_tracer()
    ):
        pass
    [model] = exported.get_finished_spans()
    assert model.attributes is not None
    assert model.attributes["cairn.model.outcome"] == "error"
    assert model.status.status_code is StatusCode.ERROR
    assert model.status.description == "model_error: overloaded"
    assert [e.name for e in model.events] == ["exception"]


async def test_an_unprintable_tool_error_still_ends_its_span(
    exported: InMemorySpanExporter,
) -> None:
    model = ScriptedModel([tool_calls(ToolCall("garbled")), "went on"])
    agent = AgentDefinition(name="g", model=model, tools=[garbled])
    events = [
        e
        async for e in run_invocation(
            agent, SessionState("s5"), Invocation("c5", "go"), tracer=engine_tracer()
        )
    ]
    assert events[-1].result.stop_reason == "end_turn"  # type: ignore[attr-defined]
    [failed] = _by_name(exported.get_finished_spans())["execute_tool garbled"]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.end_time is not None


def _path(outcomes: list[Outcome], agent: AgentDefinition) -> CommandPath:
    """The command path with the real invoker and engine, and no broker."""

    async def durable() -> None:
        return None

    writer = writer_for()
    answers = Answers(writer=writer, submit=outcomes.append, topics=TOPICS, max_bytes=1 << 20)
    return CommandPath(
        store=writer.store,
        cancels=CancelDesk(writer=writer, submit=outcomes.append, topics=TOPICS),
        invoker=Invoker(
            writer=writer,
            submit=outcomes.append,
            durable=durable,
            stopping=lambda: False,
            topics=TOPICS,
            answers=answers,
            state_max_bytes=1 << 20,
        ),
        answers=answers,
        submit=outcomes.append,
        agents={agent.name: agent},
        topics=TOPICS,
    )


def _work(command_id: str, agent: str | None, headers: list[tuple[str, bytes]]) -> CommandWork:
    record = InputRecord(Origin(TOPICS.commands, 3, 41), b"s3", b"{}", headers, 10)
    command = ParsedCommand(
        type="invoke", command_id=command_id, session_id="s3", agent=agent, input="hi"
    )
    return CommandWork(record, "s3", command)


def _results(outcomes: list[Outcome]) -> list[tuple[dict[str, Any], dict[str, bytes]]]:
    return [
        (orjson.loads(record.value), dict(record.headers))
        for outcome in outcomes
        for record in outcome.records
        if record.topic == TOPICS.results and record.value is not None
    ]


async def test_a_command_record_s_traceparent_parents_its_spans_and_outputs(
    exported: InMemorySpanExporter,
) -> None:
    outcomes: list[Outcome] = []
    model = ScriptedModel([tool_calls(ToolCall("add", {"a": 1, "b": 2})), "three"])
    path = _path(outcomes, AgentDefinition(name="calc", model=model, tools=[add]))
    await path.handle(_work("c3", "calc", [("traceparent", TRACEPARENT.encode())]))

    spans = _by_name(exported.get_finished_spans())
    [root] = spans["cairn.command"]
    assert _hex(root.context.trace_id, 32) == TRACE_ID
    assert root.parent is not None and _hex(root.parent.span_id, 16) == PARENT_SPAN_ID
    assert root.attributes is not None
    assert dict(root.attributes) == {
        "cairn.session_id": "s3",
        "cairn.command_id": "c3",
        "cairn.command.type": "invoke",
        "cairn.agent": "calc",
        "cairn.stop_reason": "end_turn",
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.destination.name": TOPICS.commands,
        "messaging.destination.partition.id": "3",
        "messaging.kafka.offset": 41,
    }
    assert [s.parent.span_id for s in spans["chat ScriptedModel"] if s.parent] == [
        root.context.span_id
    ] * 2
    [tool_span] = spans["execute_tool add"]
    assert tool_span.parent is not None and tool_span.parent.span_id == root.context.span_id

    [(result, headers)] = _results(outcomes)
    assert result["stop_reason"] == "end_turn"
    command_span = _hex(root.context.span_id, 16)
    assert headers["traceparent"] == f"00-{TRACE_ID}-{command_span}-01".encode()


async def test_a_refused_command_is_an_error_span(exported: InMemorySpanExporter) -> None:
    outcomes: list[Outcome] = []
    path = _path(outcomes, AgentDefinition(name="calc", model=ScriptedModel(["x"])))
    await path.handle(_work("c4", "nobody", []))
    [root] = exported.get_finished_spans()
    assert root.attributes is not None
    assert root.attributes["cairn.error.code"] == "unknown_agent"
    assert root.status.status_code is StatusCode.ERROR
    assert root.parent is None  # no traceparent: a trace of its own
    [(result, headers)] = _results(outcomes)
    assert result["error"]["code"] == "unknown_agent"
    assert headers["traceparent"].decode().split("-")[1] == _hex(root.context.trace_id, 32)


def test_an_exporter_that_is_not_installed_is_one_clear_error() -> None:
    _reset_global_provider()
    with pytest.raises(TracingSetupError, match=r"no span exporter 'zipkin' is installed"):
        configure_tracing({"OTEL_TRACES_EXPORTER": "zipkin"})
    assert configure_tracing({"OTEL_TRACES_EXPORTER": "none"}) == []
    assert configure_tracing({}) == []
    assert configure_tracing({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}) == []
    assert isinstance(trace_api.get_tracer_provider(), trace_api.ProxyTracerProvider)


def test_otlp_names_the_installed_otlp_exporter() -> None:
    otlp = pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    assert trace_export._exporter("otlp") is otlp.OTLPSpanExporter


WITHOUT_OTEL = textwrap.dedent(
    """
    import asyncio, sys
    sys.modules["opentelemetry"] = None  # as if the extra were not installed

    from service.agent.definition import AgentDefinition
    from service.agent.loop import Invocation, run_invocation
    from service.agent.state import SessionState
    from service.agent.tracing import NO_TRACING
    from service.app import run_service
    from service.observability.trace_export import TracingSetupError, configure_tracing
    from service.observability.tracing import current_span, engine_tracer, span
    from service.providers.scripted import ScriptedModel

    assert engine_tracer() is NO_TRACING
    assert configure_tracing({}) == []
    try:
        configure_tracing({"OTEL_TRACES_EXPORTER": "otlp"})
    except TracingSetupError as exc:
        print("refused:", exc)

    async def main():
        agent = AgentDefinition(name="a", model=ScriptedModel(["hello"]))
        with span("cairn.command", None) as command:
            current_span().set("cairn.agent", "a")
            events = [e async for e in run_invocation(
                agent, SessionState("s"), Invocation("c", "hi"), tracer=engine_tracer()
            )]
        print("stopped:", events[-1].result.stop_reason, len(command.trace_id))

    asyncio.run(main())
    loaded = [name for name, module in sys.modules.items() if module is not None]
    print("imported:", sorted(name for name in loaded if name.startswith("opentelemetry")))
    """
)


def test_without_opentelemetry_nothing_of_it_is_imported() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_OTEL],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("refused: OTEL_TRACES_EXPORTER is set but the OpenTelemetry SDK")
    assert lines[1:] == ["stopped: end_turn 32", "imported: []"]
