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

import pytest

from tests.support.runtime_harness import (
    REPO,
    Client,
    Cluster,
    ServiceProcess,
    health_port,
    invoke,
    probe,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]


async def _wait_ready(port: int, proc: ServiceProcess) -> None:
    statuses: list[int] = []

    async def ready() -> bool:
        statuses.append((await probe(port, "/readyz"))[0])
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


def _topics_create(cluster: Cluster) -> None:
    """``cairn topics create``, as an operator runs it."""
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
        status, body = await probe(health, "/readyz")
        assert status == 503
        assert f"127.0.0.1:{port} unreachable" in str(body["waiting"])
        assert (await probe(health, "/livez"))[0] == 200
        assert "Traceback" not in proc.text()

        async with _forwarder(port, cluster.bootstrap):
            await _wait_ready(health, proc)
            status, body = await probe(health, "/readyz")
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
        status, body = await probe(health, "/readyz")
        assert status == 503
        assert "missing topics" in str(body["waiting"])
        assert cluster.topics.commands in str(body["waiting"])
        assert (await probe(health, "/livez"))[0] == 200

        _topics_create(cluster)
        await _wait_ready(health, proc)
        await _answers(cluster)
        assert await proc.terminate() == 0
        assert "Traceback" not in proc.text()
    finally:
        proc.kill()


async def test_a_drain_while_waiting_keeps_the_instance_out_of_the_group(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A pre-stop hook's drain during the wait: the instance never joins, so once the topics
    exist another instance takes every partition and serves; the drained one waits, alive and
    not ready, for its SIGTERM."""
    cluster = Cluster(kafka_bootstrap, tmp_path)  # no topics yet
    first = cluster.start("first")
    second = None
    try:
        await first.wait_log("not serving yet")
        health = await health_port(first)
        assert await probe(health, "/drain") == (200, {"status": "drained"})
        await first.wait_log("drained before joining the group")

        _topics_create(cluster)
        second = cluster.start("second")
        second_health = await health_port(second)
        await _wait_ready(second_health, second)
        everything = sorted(str(p) for p in range(cluster.partitions))
        assert (await probe(second_health, "/readyz"))[1]["assigned"] == everything
        await _answers(cluster)

        status, body = await probe(health, "/readyz")
        assert (status, body["assigned"], body["stopping"]) == (503, [], True)
        assert (await probe(health, "/livez"))[0] == 200
        assert first.log_count("| joining") == 0
        assert await first.terminate() == 0
        assert await second.terminate() == 0
        assert "Traceback" not in first.text()
    finally:
        first.kill()
        if second is not None:
            second.kill()


async def _refused_start(cluster: Cluster, **env: str) -> str:
    """``cairn serve`` with ``env`` on the cluster's topics, which must end with status 1 and no
    traceback; its own one line."""
    _topics_create(cluster)
    proc = cluster.start(CAIRN_LOG_JSON="true", **env)
    try:
        await wait_for(lambda: not proc.alive, 60, "the start ends", on_timeout=proc.text)
        assert proc.process.returncode == 1
        text = proc.text()
        assert "Traceback" not in text
        [line] = [line for line in text.splitlines() if line.startswith("cairn serve:")]
        return line
    finally:
        proc.kill()


async def test_a_session_timeout_the_broker_refuses_is_one_line_naming_it(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The broker refuses to let a member join with a session timeout outside its bounds (6 s
    to 30 min by default): no wait fixes that, so the start ends, status 1, in one line naming
    the setting, instead of a traceback of an exception group."""
    line = await _refused_start(
        Cluster(kafka_bootstrap, tmp_path),
        CAIRN_GROUP__SESSION_TIMEOUT_MS="4000000",
        CAIRN_GROUP__REBALANCE_TIMEOUT_MS="4000000",
    )
    assert "CAIRN_GROUP__SESSION_TIMEOUT_MS (4000000 ms)" in line


@pytest.mark.parametrize(
    "mode",
    [
        {},
        {"CAIRN_RUNTIME__TRANSACTION_STREAMS": "instance"},
        {"CAIRN_RUNTIME__TRANSACTIONS_VERSION": "1"},
    ],
    ids=["partition-streams", "instance-stream", "transactions-v1"],
)
async def test_a_transaction_timeout_the_broker_refuses_is_one_line_naming_it(
    kafka_bootstrap: str, tmp_path: Path, mode: dict[str, str]
) -> None:
    """Above the broker's transaction.max.timeout.ms no producer starts: every partition owner
    failed and was re-created every few seconds, for ever, while the instance reported its
    partitions as restoring. The start ends instead, status 1, in one line naming the setting."""
    line = await _refused_start(
        Cluster(kafka_bootstrap, tmp_path), CAIRN_RUNTIME__TRANSACTION_TIMEOUT_MS="99999999", **mode
    )
    assert "CAIRN_RUNTIME__TRANSACTION_TIMEOUT_MS (99999999 ms)" in line
