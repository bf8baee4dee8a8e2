"""A service process with OpenTelemetry's SDK turned on by its own variables
(``OTEL_TRACES_EXPORTER=console``): the spans of a traced command reach the exporter, nested as
command → model calls and tool calls, in the trace of the record's ``traceparent``."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from tests.support.runtime_harness import Client, Cluster, invoke, unique

pytest.importorskip("opentelemetry.sdk")
pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"
_SPAN_BLOCK = re.compile(r"^\{\n.*?^\}$", re.MULTILINE | re.DOTALL)


def _exported(text: str) -> list[dict[str, Any]]:
    """The spans the console exporter wrote (one indented JSON object each) among log lines."""
    return [json.loads(block) for block in _SPAN_BLOCK.findall(text)]


async def test_a_traced_command_exports_its_span_tree(cluster: Cluster) -> None:
    proc = cluster.start(OTEL_TRACES_EXPORTER="console", OTEL_BSP_SCHEDULE_DELAY="200")
    session = unique("s")
    command = invoke(session, "hello", agent="cycles")  # two tool calls, then an answer
    try:
        await proc.wait_ready()
        producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all")
        await producer.start()
        try:
            async with Client(cluster) as client:
                await producer.send_and_wait(
                    cluster.topics.commands,
                    key=session.encode(),
                    value=orjson.dumps(command),
                    headers=[("traceparent", TRACEPARENT.encode())],
                )
                result = await client.result(command["command_id"], alive=proc)
        finally:
            await producer.stop()
        assert await proc.terminate() == 0  # flushes what is still queued
    finally:
        proc.kill()

    spans = [s for s in _exported(proc.text()) if s["context"]["trace_id"] == f"0x{TRACE_ID}"]
    [root] = [s for s in spans if s["name"] == "cairn.command"]
    assert root["parent_id"] == f"0x{PARENT_SPAN_ID}"
    assert root["kind"] == "SpanKind.CONSUMER"
    assert root["attributes"]["cairn.command_id"] == command["command_id"]
    assert root["attributes"]["cairn.session_id"] == session
    assert root["attributes"]["cairn.agent"] == "cycles"
    assert root["attributes"]["cairn.stop_reason"] == "end_turn"
    assert root["resource"]["attributes"]["service.name"] == "cairn"

    children = [s for s in spans if s is not root]
    assert sorted(s["name"] for s in children) == [
        "chat CycleModel",
        "chat CycleModel",
        "chat CycleModel",
        "execute_tool record",
        "execute_tool record",
    ]
    assert {s["parent_id"] for s in children} == {root["context"]["span_id"]}
    tools = [s for s in children if s["name"] == "execute_tool record"]
    assert {s["attributes"]["cairn.tool.status"] for s in tools} == {"success"}

    # The result continues the trace from the command's span.
    command_span = root["context"]["span_id"].removeprefix("0x")
    assert result["_headers"]["traceparent"] == f"00-{TRACE_ID}-{command_span}-01".encode()
