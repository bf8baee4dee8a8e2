"""`cairn serve` waits for a broker that is not there yet and for topics not created yet: alive,
not ready, one line per attempt, and ready once they appear, with no restart of the process."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.support.runtime_harness import (
    REPO,
    Client,
    Cluster,
    ServiceProcess,
    health_port,
    invoke,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]


async def _probe(port: int, path: str) -> tuple[int, dict[str, object]]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, orjson.loads(await response.read())


async def _wait_ready(port: int, proc: ServiceProcess) -> None:
    statuses: list[int] = []

    async def ready() -> bool:
        statuses.append((await _probe(port, "/readyz"))[0])
        return statuses[-1] == 200

    deadline = asyncio.get_running_loop().time() + 60
    while not await ready():
        assert proc.alive, proc.text()[-3000:]
        assert asyncio.get_running_loop().time() < deadline, proc.text()[-3000:]
        await asyncio.sleep(0.1)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.asynccontextmanager
async def _forwarder(port: int, target: str) -> AsyncIterator[None]:
    """Listens on ``port`` and forwards every connection to ``target`` (host:port)."""
    host, target_port = target.rsplit(":", 1)

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(host, int(target_port))
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    try:
        yield
    finally:
        server.close()


async def _answers(cluster: Cluster) -> None:
    """The instance serves: an invoke gets its result."""
    async with Client(cluster) as client:
        command = invoke("s-robust", "hello", agent="simple")
        await client.send(command)
        await wait_for(
            lambda: any(r["command_id"] == command["command_id"] for r in client.results),
            60,
            "the invoke's result",
        )


async def test_a_broker_that_appears_later_makes_it_ready(cluster: Cluster) -> None:
    port = _free_port()
    proc = cluster.start(CAIRN_KAFKA__BOOTSTRAP_SERVERS=f"127.0.0.1:{port}")
    try:
        await proc.wait_log("not serving yet", count=2)
        health = await health_port(proc)
        status, body = await _probe(health, "/readyz")
        assert status == 503
        assert f"127.0.0.1:{port} unreachable" in str(body["waiting"])
        assert (await _probe(health, "/livez"))[0] == 200
        assert "Traceback" not in proc.text()

        async with _forwarder(port, cluster.bootstrap):
            await _wait_ready(health, proc)
            status, body = await _probe(health, "/readyz")
            assert "waiting" not in body
            assert proc.log_count("broker and topics found") == 1
            await _answers(cluster)
            assert await proc.terminate() == 0
        assert "Traceback" not in proc.text()
    finally:
        proc.kill()


async def test_missing_topics_are_waited_for_until_topics_create(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    cluster = Cluster(kafka_bootstrap, tmp_path)  # no topics yet
    proc = cluster.start()
    try:
        await proc.wait_log("not serving yet", count=2)
        health = await health_port(proc)
        status, body = await _probe(health, "/readyz")
        assert status == 503
        assert "missing topics" in str(body["waiting"])
        assert cluster.topics.commands in str(body["waiting"])
        assert (await _probe(health, "/livez"))[0] == 200

        created = subprocess.run(
            [sys.executable, "-m", "service", "topics", "create"],
            cwd=REPO,
            env=cluster.env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert created.returncode == 0, created.stderr
        await _wait_ready(health, proc)
        await _answers(cluster)
        assert await proc.terminate() == 0
        assert "Traceback" not in proc.text()
    finally:
        proc.kill()
