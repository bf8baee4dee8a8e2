"""``make run``'s script brings up a broker, the topics and the demo service that answers a first
command; Ctrl-C stops the service and leaves the broker running until it is stopped."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.runtime_harness import REPO, unique, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(420)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_run_script_serves_the_demo_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    port, controller = _free_port(), _free_port()
    kafka_args = f"--data-dir {tmp_path / 'kafka'} --port {port} --controller-port {controller}"
    env = {key: value for key, value in os.environ.items() if not key.startswith("CAIRN_")} | {
        "CAIRN_PYTHON": sys.executable,
        "KAFKA_ARGS": kafka_args,
        "CAIRN_HEALTH_PORT": "0",
        "CAIRN_GROUP__GROUP_ID": unique("run"),
    }
    log = tmp_path / "run.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["bash", "deploy/run-local.sh"], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:

        def text() -> str:
            return log.read_text(errors="replace")

        await wait_for(
            lambda: "partition ready" in text(), 300, "the service is ready", on_timeout=text
        )
        assert "cairn invoke --session demo-1" in text()
        assert f"Kafka at 127.0.0.1:{port}" in text()

        client_env = env | {"CAIRN_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{port}"}
        session = unique("s")
        client = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "service", "invoke", "--session", session, "--wait"),
            "What is 6 * 7?",
            cwd=REPO,
            env=client_env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(client.communicate(), 90)
        assert client.returncode == 0, out.decode()
        assert b"stop_reason=interrupt" in out

        process.send_signal(signal.SIGINT)
        await wait_for(lambda: process.poll() is not None, 60, "the service exits", on_timeout=text)
        assert process.returncode == 0, text()[-3000:]

        status = subprocess.run(
            [sys.executable, "deploy/local-kafka/kafka_local.py", "status", *kafka_args.split()],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        )
        assert status.returncode == 0, status.stdout + status.stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        subprocess.run(
            [sys.executable, "deploy/local-kafka/kafka_local.py", "down", *kafka_args.split()],
            cwd=REPO,
            check=False,
            capture_output=True,
        )


def test_run_script_on_a_taken_kafka_port_says_how_to_pick_others(tmp_path: Path) -> None:
    """9092 is often someone else's (another broker, a container): the refusal names the options
    that move the broker, and how to pass them through make, and nothing starts."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")} | {
            "CAIRN_PYTHON": sys.executable,
            "KAFKA_ARGS": f"--data-dir {tmp_path / 'kafka'} --port {taken} "
            f"--controller-port {_free_port()}",
        }
        done = subprocess.run(
            ["bash", "deploy/run-local.sh"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode != 0
    assert f"127.0.0.1:{taken}> | already in use by another process" in done.stderr
    assert 'KAFKA_ARGS="--port' in done.stderr and "--controller-port" in done.stderr
    assert "Cairn is starting" not in done.stdout
