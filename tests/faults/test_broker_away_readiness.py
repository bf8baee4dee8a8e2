"""Readiness while the broker is away: an instance cut off from its broker past the session
timeout has lost its group membership and serves nothing, so it reports not ready (and stays
alive: a restart would not bring the broker back); ready again once the broker is back, it
rejoined and its partitions are restored, and it answers. Meanwhile no client it started is
left unclosed (aiokafka's ``Unclosed AIOKafkaConsumer`` ERROR)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.own_broker import OwnBroker, own_broker
from tests.support.runtime_harness import (
    SESSION_TIMEOUT_MS,
    Client,
    Cluster,
    ServiceProcess,
    health_port,
    invoke,
    probe,
    services,
    unique,
)

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.timeout(400)]

SESSION_TIMEOUT_S = SESSION_TIMEOUT_MS / 1000


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[OwnBroker]:
    with own_broker(tmp_path / "kafka") as started:
        yield started


async def _readyz_until(
    port: int, proc: ServiceProcess, status: int, timeout: float
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    answers: list[tuple[int, dict[str, Any]]] = []
    while True:
        answers.append(await probe(port, "/readyz"))
        if answers[-1][0] == status:
            return answers[-1][1]
        assert proc.alive, proc.text()[-3000:]
        assert time.monotonic() < deadline, (answers[-1], proc.text()[-3000:])
        await asyncio.sleep(0.2)


async def _answers(cluster: Cluster, proc: ServiceProcess) -> None:
    async with Client(cluster) as client:
        commands = [invoke(unique("s"), "hi", agent="simple") for _ in range(6)]
        for command in commands:
            await client.send(command)
        for command in commands:
            await client.result(command["command_id"], timeout=90, alive=proc)


@contextlib.asynccontextmanager
async def _serving_alone(
    broker: OwnBroker, tmp_path: Path
) -> AsyncIterator[tuple[Cluster, ServiceProcess, int]]:
    """One instance on the broker's fresh topics, ready; its cluster, process and health port."""
    cluster = Cluster(broker.bootstrap, tmp_path)
    await cluster.create_topics()
    with services() as procs:
        proc = cluster.start("only")
        procs.append(proc)
        await proc.wait_ready()
        port = await health_port(proc)
        await _readyz_until(port, proc, 200, 30)
        yield cluster, proc, port


async def test_not_ready_while_the_broker_is_away_past_the_session_timeout(
    broker: OwnBroker, tmp_path: Path
) -> None:
    async with _serving_alone(broker, tmp_path) as (cluster, proc, port):
        stopped = time.monotonic()
        broker.stop()
        body = await _readyz_until(port, proc, 503, 3 * SESSION_TIMEOUT_S + 10)
        assert time.monotonic() - stopped >= SESSION_TIMEOUT_S
        assert "session timeout" in body["membership"], body
        assert (await probe(port, "/livez"))[0] == 200
        # Still not ready a while later: nothing comes back on its own.
        await asyncio.sleep(SESSION_TIMEOUT_S)
        assert (await probe(port, "/readyz"))[0] == 503
        assert (await probe(port, "/livez"))[0] == 200

        broker.start()
        body = await _readyz_until(port, proc, 200, 120)
        assert "membership" not in body
        await _answers(cluster, proc)
        assert await proc.terminate() == 0
    assert "Unclosed AIOKafka" not in proc.text()


async def test_a_drain_and_a_stop_while_the_broker_is_away_end_as_documented(
    broker: OwnBroker, tmp_path: Path
) -> None:
    """The broker killed under a serving instance: its fetches fail and wait out their retry
    backoff. A drain then leaves the process alive (not ready, `/livez` 200) until SIGTERM ends
    it with status 0, as with the broker up; aiokafka's consumer let a fetch's cancellation out
    of its stop, which ended the process at the drain with status 1 and a traceback."""
    async with _serving_alone(broker, tmp_path) as (_, proc, port):
        broker.kill()
        await proc.wait_log("Failed fetch messages", timeout=30, count=3)
        assert (await probe(port, "/drain"))[0] == 200
        await proc.wait_log("left the group", timeout=30)
        body = await _readyz_until(port, proc, 503, 10)
        assert body["stopping"] is True
        assert (await probe(port, "/livez"))[0] == 200
        assert proc.alive
        assert await proc.terminate() == 0
    assert "Traceback" not in proc.text()
