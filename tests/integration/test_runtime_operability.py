"""Operability of a running service against a real broker: health, readiness during restore,
Prometheus metrics after real traffic, JSON log context and trace context on the outputs.

The service is a real OS process; its endpoint's port is the one it logs as bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from tests.support.runtime_harness import (
    Client,
    Cluster,
    ServiceProcess,
    health_port,
    invoke,
    services,
    unique,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(150)]

_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
_PARENT_SPAN = "00f067aa0ba902b7"
_TRACEPARENT = f"00-{_TRACE_ID}-{_PARENT_SPAN}-01"


async def _get(http: aiohttp.ClientSession, port: int, path: str) -> tuple[int, str]:
    async with http.get(f"http://127.0.0.1:{port}{path}") as response:
        return response.status, await response.text()


async def _wait_status(
    http: aiohttp.ClientSession, port: int, path: str, status: int, proc: ServiceProcess
) -> str:
    seen: list[tuple[int, str]] = []

    async def probe() -> None:
        seen.append(await _get(http, port, path))

    deadline = asyncio.get_running_loop().time() + 40
    while True:
        await probe()
        if seen[-1][0] == status:
            return seen[-1][1]
        assert proc.alive, proc.text()[-3000:]
        assert asyncio.get_running_loop().time() < deadline, (seen[-1], proc.text()[-3000:])
        await asyncio.sleep(0.05)


def _sample(metrics: str, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels`` (0 when none)."""
    total = 0.0
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def _json_lines(proc: ServiceProcess) -> list[dict[str, Any]]:
    lines = []
    for line in proc.text().splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict):
                lines.append(entry)
    return lines


async def test_readyz_is_false_while_restoring_and_true_after(cluster: Cluster) -> None:
    with services() as procs:
        proc = cluster.start(CAIRN_FAULTS__HOLD_RESTORE="true")
        procs.append(proc)
        port = await health_port(proc)
        async with aiohttp.ClientSession() as http:
            assert (await _get(http, port, "/livez"))[0] == 200
            await proc.wait_log("restore held until SIGUSR1")
            status, body = await _get(http, port, "/readyz")
            assert status == 503, body
            detail = orjson.loads(body)
            assert detail["joined"] is True and detail["restoring"], detail
            # The endpoint keeps answering while restores hold: the process is alive.
            assert (await _get(http, port, "/livez"))[0] == 200

            proc.signal(signal.SIGUSR1)
            body = await _wait_status(http, port, "/readyz", 200, proc)
            detail = orjson.loads(body)
            assert detail["restoring"] == [] and len(detail["assigned"]) == cluster.partitions
            metrics = (await _get(http, port, "/metrics"))[1]
            assert _sample(metrics, "cairn_restore_seconds_count") == cluster.partitions
            assert _sample(metrics, "cairn_assigned_partitions") == cluster.partitions

            # The pre-stop drain: not ready from then on, still alive until SIGTERM.
            async with http.post(f"http://127.0.0.1:{port}/drain") as response:
                assert response.status == 200
                assert (await response.json())["status"] == "drained"
            status, body = await _get(http, port, "/readyz")
            detail = orjson.loads(body)
            assert status == 503 and detail["stopping"] is True, body
            # Out of the group: nothing held, nothing joined.
            assert detail["joined"] is False and detail["assigned"] == [], body
            assert (await _get(http, port, "/livez"))[0] == 200
        assert await proc.terminate() == 0, proc.text()[-3000:]


@dataclass
class _Outputs:
    """Results and events as records, headers included."""

    records: list[tuple[str, dict[str, Any], dict[str, bytes]]] = field(default_factory=list)

    def of(self, topic: str, command_id: str) -> list[tuple[dict[str, Any], dict[str, bytes]]]:
        return [
            (value, headers)
            for name, value, headers in self.records
            if name == topic and value.get("command_id") == command_id
        ]


@contextlib.asynccontextmanager
async def _outputs(cluster: Cluster) -> AsyncIterator[_Outputs]:
    topics = cluster.topics
    consumer = AIOKafkaConsumer(
        bootstrap_servers=cluster.bootstrap,
        group_id=None,
        isolation_level="read_committed",
        enable_auto_commit=False,
    )
    await consumer.start()
    partitions = [
        TopicPartition(topic, p)
        for topic in (topics.results, topics.events)
        for p in range(cluster.partitions)
    ]
    consumer.assign(partitions)
    await consumer.seek_to_beginning(*partitions)
    outputs = _Outputs()

    async def read() -> None:
        while True:
            batches = await consumer.getmany(timeout_ms=100)
            for records in batches.values():
                for record in records:
                    outputs.records.append(
                        (record.topic, orjson.loads(record.value), dict(record.headers))
                    )

    reader = asyncio.create_task(read())
    try:
        yield outputs
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        await consumer.stop()


async def test_metrics_logs_and_trace_context_follow_real_traffic(cluster: Cluster) -> None:
    session = unique("s")
    traced = invoke(session, "hello", agent="simple")
    unknown = invoke(unique("s"), "hello", agent="nobody-hosts-this")
    cancel = {
        "type": "cancel",
        "schema_version": 1,
        "command_id": unique("x"),
        "session_id": session,
    }
    with services() as procs:
        proc = cluster.start(CAIRN_LOG_JSON="true")
        procs.append(proc)
        port = await health_port(proc)
        await proc.wait_ready()
        producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all")
        await producer.start()
        try:
            async with Client(cluster) as client, _outputs(cluster) as outputs:
                header = [("traceparent", _TRACEPARENT.encode())]
                await producer.send_and_wait(
                    cluster.topics.commands,
                    key=session.encode(),
                    value=orjson.dumps(traced),
                    headers=header,
                )
                await client.result(traced["command_id"], alive=proc)
                # The same command again: recognised as a duplicate and answered never again.
                await producer.send_and_wait(
                    cluster.topics.commands,
                    key=session.encode(),
                    value=orjson.dumps(traced),
                    headers=header,
                )
                await client.send(unknown)
                await client.send_raw(None, b"\x00 this is not json")
                await client.send(cancel, topic=cluster.topics.control)
                await client.result(unknown["command_id"], alive=proc)
                await client.result(cancel["command_id"], alive=proc)
                await wait_for(
                    lambda: len(client.dead_letters) == 1, 30, "one dead letter", alive=proc
                )

                async with aiohttp.ClientSession() as http:

                    async def duplicate_counted() -> str:
                        text = ""

                        async def scrape() -> bool:
                            nonlocal text
                            text = (await _get(http, port, "/metrics"))[1]
                            return (
                                _sample(
                                    text, "cairn_commands_total", type="invoke", outcome="duplicate"
                                )
                                >= 1
                            )

                        deadline = asyncio.get_running_loop().time() + 30
                        while not await scrape():
                            assert asyncio.get_running_loop().time() < deadline, text
                            await asyncio.sleep(0.05)
                        return text

                    metrics = await duplicate_counted()
                    assert (await _get(http, port, "/livez"))[0] == 200
                    # Ready again after the traffic (a partition re-restored after a failed
                    # commit or a rebalance under load may dip readiness for a moment).
                    await _wait_status(http, port, "/readyz", 200, proc)

                def commands(kind: str, outcome: str) -> float:
                    return _sample(metrics, "cairn_commands_total", type=kind, outcome=outcome)

                assert commands("invoke", "ok") == 1, metrics
                assert commands("invoke", "duplicate") == 1, metrics
                assert commands("invoke", "error") == 1, metrics
                assert commands("other", "dlq") == 1, metrics
                assert commands("cancel", "ok") == 1, metrics
                assert _sample(metrics, "cairn_results_total", stop_reason="end_turn") == 1
                assert _sample(metrics, "cairn_results_total", stop_reason="error") == 1
                assert _sample(metrics, "cairn_results_total", stop_reason="cancelled") == 1
                assert _sample(metrics, "cairn_result_errors_total", code="unknown_agent") == 1
                assert _sample(metrics, "cairn_dlq_records_total") == 1, metrics
                assert _sample(metrics, "cairn_cancels_total", outcome="idle") == 1, metrics
                assert _sample(metrics, "cairn_rebalances_total", kind="assigned") >= 1
                assert _sample(metrics, "cairn_step_seconds_count") >= 1
                assert _sample(metrics, "cairn_commit_seconds_count") >= 3
                assert _sample(metrics, "cairn_inflight_invocations") == 0

                # The result and every event of the traced command continue its trace.
                topics = cluster.topics
                await wait_for(
                    lambda: bool(outputs.of(topics.results, traced["command_id"])),
                    30,
                    "the traced result with its headers",
                    alive=proc,
                )
                produced = outputs.of(topics.results, traced["command_id"]) + outputs.of(
                    topics.events, traced["command_id"]
                )
                assert len(produced) >= 2, produced
                spans = set()
                for _, headers in produced:
                    version, trace_id, span_id, _flags = headers["traceparent"].decode().split("-")
                    assert (version, trace_id) == ("00", _TRACE_ID), headers
                    assert span_id != _PARENT_SPAN and len(span_id) == 16
                    spans.add(span_id)
                assert len(spans) == 1, spans  # one span: the command's processing
                # A command without trace context starts a trace of its own.
                (_, own), *_ = outputs.of(topics.results, unknown["command_id"])
                assert _TRACE_ID not in own["traceparent"].decode()
        finally:
            await producer.stop()

        lines = _json_lines(proc)
        assert lines, proc.text()[-2000:]
        duplicate_lines = [line for line in lines if "duplicate command" in line.get("message", "")]
        assert duplicate_lines, proc.text()[-3000:]
        assert duplicate_lines[0]["session_id"] == session
        assert duplicate_lines[0]["command_id"] == traced["command_id"]
        assert duplicate_lines[0]["trace_id"] == _TRACE_ID
        rejected = [line for line in lines if line.get("command_id") == unknown["command_id"]]
        assert rejected and rejected[0]["session_id"] == unknown["session_id"], rejected
        cancelled = [line for line in lines if line.get("command_id") == cancel["command_id"]]
        assert any("cancel answered" in line["message"] for line in cancelled), cancelled
        assert await proc.terminate() == 0, proc.text()[-3000:]


_AGENTS_TOML = """
[[agents]]
name = "writer"
model = "claude-sonnet-4-5"
[agents.provider]
type = "anthropic"
api_key_env = "CAIRN_OPS_TEST_KEY"
"""


async def test_service_hosts_the_agents_of_an_agents_file(cluster: Cluster) -> None:
    agents_file = cluster.workdir / "agents.toml"
    agents_file.write_text(_AGENTS_TOML)
    with services() as procs:
        missing = cluster.start(CAIRN_AGENTS=str(agents_file))
        procs.append(missing)
        await wait_for(lambda: not missing.alive, 30, "exit without the key variable")
        assert missing.process.returncode == 1, missing.text()[-2000:]
        assert "CAIRN_OPS_TEST_KEY" in missing.text() and "Traceback" not in missing.text()

        proc = cluster.start(CAIRN_AGENTS=str(agents_file), CAIRN_OPS_TEST_KEY="sk-test-0123")
        procs.append(proc)
        await proc.wait_ready()
        await proc.wait_log("agents=<['writer']> | started")
        assert "sk-test-0123" not in proc.text()
        assert await proc.terminate() == 0, proc.text()[-3000:]
