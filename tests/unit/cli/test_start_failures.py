"""What stops `cairn serve` and `cairn topics create` from starting is one line and status 1,
never a traceback; an unreachable broker is waited for, not ready and alive, until SIGTERM ends
the wait with status 0. Real processes, as an orchestrator runs them; no broker is needed."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.timeout(90)


def _closed_port() -> int:
    """A port nothing listens on (bound once to pick it, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = {
        key: value for key, value in os.environ.items() if not key.startswith(("CAIRN_", "OTEL_"))
    }
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "CAIRN_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{_closed_port()}",
            "CAIRN_HEALTH_PORT": "0",
            "CAIRN_LOG_JSON": "true",
        }
    )
    env.update(extra)
    return env


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service", *args],
        cwd=REPO,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _own_lines(stderr: str, command: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(f"{command}:")]


@pytest.mark.parametrize("variable", ["CAIRN_GROUP__GROUP_ID", "CAIRN_GROUP__INSTANCE_ID"])
def test_an_empty_group_or_instance_id_is_an_invalid_setting(variable: str) -> None:
    # Taken, an empty group id fails only once the group is joined, in a traceback.
    done = _run("serve", **{variable: ""})
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.splitlines()
    assert line == (
        f"cairn serve: invalid setting: {variable}: String should have at least 1 character"
    )


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("CAIRN_RUNTIME__MAX_IN_FLIGHT", "lots", "valid integer"),
        ("CAIRN_KAFKA__SECURITY_PROTOCOL", "TLS", "'PLAINTEXT'"),
        ("CAIRN_LOG_LEVEL", "LOUD", "not a log level"),
        ("CAIRN_HEALTH_PORT", "-1", "greater than or equal to 0"),
        ("CAIRN_HEALTH_PORT", "99999", "less than or equal to 65535"),
        ("CAIRN_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:99999", "port is not a number from 1"),
        ("CAIRN_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:abc", "port is not a number from 1"),
    ],
)
@pytest.mark.parametrize(
    ("command", "name", "status"),
    [
        (("serve",), "cairn serve", 1),
        (("topics", "create"), "cairn topics create", 1),
        (("agents", "list"), "cairn agents list", 1),
        (("session", "show", "s-1"), "cairn", 2),
        (("invoke", "--session", "s-1", "hi"), "cairn", 2),
    ],
)
def test_an_invalid_setting_is_one_line_naming_it(
    command: tuple[str, ...], name: str, status: int, variable: str, value: str, says: str
) -> None:
    done = _run(*command, **{variable: value})
    assert done.returncode == status, done.stderr
    assert "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"{name}: invalid setting: {variable}: ")
    assert says in line
    assert value not in done.stderr.replace(variable, ""), "the value is never echoed"


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("cairn.control", "CAIRN_TOPICS__COMMANDS and CAIRN_TOPICS__CONTROL name the same topic"),
        ("", "CAIRN_TOPICS__COMMANDS: a topic name cannot be empty"),
        ("cairn/commands", "CAIRN_TOPICS__COMMANDS: a topic name holds only ASCII letters"),
    ],
)
@pytest.mark.parametrize("command", [("serve",), ("topics", "create")])
def test_a_topic_name_the_service_cannot_run_on_is_one_line_naming_it(
    command: tuple[str, ...], value: str, says: str
) -> None:
    """Accepted, a shared topic was served (commands read cancels) and an empty name failed
    later with a broker error code that named no setting."""
    done = _run(*command, CAIRN_TOPICS__COMMANDS=value)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"cairn {' '.join(command)}: invalid setting: {says}"), line
    assert "CAIRN_TOPICS__COMMANDS" in line


def test_a_store_folder_that_cannot_be_used_is_one_line_naming_it(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    folder = blocker / "store"  # under a file: no folder can be made there
    done = _run("serve", CAIRN_SESSIONS__STORE_DIR=str(folder))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    [line] = _own_lines(done.stderr, "cairn serve")
    assert str(folder) in line and "CAIRN_SESSIONS__STORE_DIR" in line


@pytest.mark.parametrize(
    ("command", "name", "status"),
    [
        (("serve",), "cairn serve", 1),
        (("topics", "create"), "cairn topics create", 1),
        (("session", "show", "s-1"), "cairn", 2),
    ],
)
def test_a_tls_file_that_does_not_load_is_one_line_naming_it(
    command: tuple[str, ...], name: str, status: int, tmp_path: Path
) -> None:
    """Taken, every connection failed and was reported as an unreachable broker, for ever."""
    done = _run(
        *command,
        CAIRN_KAFKA__SECURITY_PROTOCOL="SSL",
        CAIRN_KAFKA__SSL_CAFILE=str(tmp_path / "absent.pem"),
    )
    assert done.returncode == status, done.stderr
    assert "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()
    assert line == f"{name}: invalid setting: CAIRN_KAFKA__SSL_CAFILE: no file at " + str(
        tmp_path / "absent.pem"
    )


def test_a_secret_is_never_echoed_in_a_settings_error() -> None:
    done = _run(
        "serve",
        CAIRN_KAFKA__SASL_PASSWORD="hunter2-secret",
        CAIRN_KAFKA__SASL_MECHANISM="ROT13",
    )
    assert done.returncode == 1
    assert "CAIRN_KAFKA__SASL_MECHANISM" in done.stderr
    assert "hunter2" not in done.stderr and "ROT13" not in done.stderr


def test_a_bad_agents_file_is_named_in_one_line(tmp_path: Path) -> None:
    agents = tmp_path / "agents.toml"
    agents.write_text('[[agents]]\nname = "a"\nmodel = "m"\n[agents.provider]\ntype = "nope"\n')
    done = _run("serve", CAIRN_AGENTS=str(agents))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    [line] = _own_lines(done.stderr, "cairn serve")
    assert str(agents) in line


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def test_a_taken_health_port_is_one_line_and_status_1(taken_port: int) -> None:
    done = _run("serve", CAIRN_HEALTH_PORT=str(taken_port))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    [line] = _own_lines(done.stderr, "cairn serve")
    assert f"health port {taken_port} cannot be bound (CAIRN_HEALTH_PORT)" in line
    assert "address already in use" in line


def test_a_health_host_not_on_this_machine_is_one_line_naming_it() -> None:
    # 192.0.2.1 is TEST-NET-1: never an address of this machine.
    done = _run("serve", CAIRN_HEALTH_HOST="192.0.2.1", CAIRN_HEALTH_PORT="0")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    [line] = _own_lines(done.stderr, "cairn serve")
    assert "health port 192.0.2.1:0 cannot be bound (CAIRN_HEALTH_HOST, CAIRN_HEALTH_PORT)" in line


def test_topics_create_against_an_unreachable_broker_is_one_line() -> None:
    done = _run("topics", "create")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert re.match(r"cairn topics create: broker 127\.0\.0\.1:\d+ unreachable: ", done.stderr)
    assert "Connect call failed" in done.stderr


class _Serving:
    """``python -m service serve`` with its stderr (JSON log lines) collected in a file."""

    def __init__(self, tmp_path: Path, **env: str) -> None:
        self.log = tmp_path / "serve.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "service", "serve"],
                cwd=REPO,
                env=_env(CAIRN_LOG_REPEAT_LIMIT="0", **env),
                stdout=subprocess.DEVNULL,
                stderr=out,
            )

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines()

    def records(self) -> list[dict[str, object]]:
        return [orjson.loads(line) for line in self.lines() if line.startswith("{")]

    def attempts(self) -> list[dict[str, object]]:
        return [r for r in self.records() if "not serving yet" in str(r["message"])]

    async def until(self, what: str, condition: object, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not callable(condition) or not condition():
            assert self.process.poll() is None, f"exited while waiting for {what}:\n{self.lines()}"
            assert time.monotonic() < deadline, f"no {what} in {timeout} s:\n{self.lines()}"
            await asyncio.sleep(0.05)

    def port(self) -> int:
        for record in self.records():
            found = re.search(r"port=<(\d+)> \| health server listening", str(record["message"]))
            if found:
                return int(found[1])
        raise AssertionError("no health server line")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


def _field(record: dict[str, object], name: str) -> str:
    found = re.search(rf"{name}=<([^>]*)>", str(record["message"]))
    assert found is not None, record
    return found[1]


async def _get(port: int, path: str) -> tuple[int, dict[str, object]]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, orjson.loads(await response.read())


async def test_an_unreachable_broker_is_waited_for_alive_and_not_ready(tmp_path: Path) -> None:
    serving = _Serving(tmp_path)
    try:
        await serving.until("three attempts", lambda: len(serving.attempts()) >= 3)
        port = serving.port()
        status, body = await _get(port, "/readyz")
        assert status == 503
        assert body["status"] == "not_ready"
        assert "unreachable" in str(body["waiting"])
        assert (await _get(port, "/livez"))[0] == 200

        attempts = serving.attempts()
        assert [r["level"] for r in attempts] == ["warning"] * len(attempts)
        numbers = [int(_field(r, "attempt")) for r in attempts]
        assert numbers == list(range(1, len(attempts) + 1))
        waits = [float(_field(r, "retry_in_s")) for r in attempts]
        assert waits[:3] == [0.5, 1.0, 2.0]
        # One line per attempt: aiokafka's own account of the failed connection is in it.
        assert all("Connect call failed" in str(r["message"]) for r in attempts)
        others = [r for r in serving.records() if "Unable connect" in str(r["message"])]
        assert others == attempts
        assert "Traceback" not in serving.log.read_text()

        started = time.monotonic()
        serving.process.send_signal(signal.SIGTERM)
        assert serving.process.wait(10) == 0
        assert time.monotonic() - started < 5
        assert "Traceback" not in serving.log.read_text()
    finally:
        serving.stop()


async def test_the_health_host_keeps_the_endpoint_to_that_address(tmp_path: Path) -> None:
    """With ``CAIRN_HEALTH_HOST=127.0.0.1`` another loopback address (every 127.x.y.z is this
    machine's) finds nothing on the port: so would another machine."""
    serving = _Serving(tmp_path, CAIRN_HEALTH_HOST="127.0.0.1")
    try:
        await serving.until("the health server", lambda: "health server listening" in
                            serving.log.read_text())  # fmt: skip
        port = serving.port()
        assert (await _get(port, "/livez"))[0] == 200
        with pytest.raises(aiohttp.ClientConnectorError):
            async with aiohttp.ClientSession() as http:
                await http.get(f"http://127.0.0.2:{port}/livez")
    finally:
        serving.stop()


async def test_a_fault_setting_is_a_warning_at_start(tmp_path: Path) -> None:
    serving = _Serving(tmp_path, CAIRN_FAULTS__HOLD_RESTORE="true", CAIRN_FAULTS__KILL_AFTER="3")
    try:
        await serving.until("the warning", lambda: "fault injection" in serving.log.read_text())
        [warning] = [r for r in serving.records() if "fault injection" in str(r["message"])]
        assert warning["level"] == "warning"
        assert _field(warning, "variables") == (
            "CAIRN_FAULTS__HOLD_RESTORE, CAIRN_FAULTS__KILL_AFTER"
        )
    finally:
        serving.stop()


def test_a_variable_that_names_no_setting_is_a_warning_naming_the_likely_one() -> None:
    done = _run(
        "agents",
        "list",
        CAIRN_KAFKA_BOOTSTRAP_SERVERS="broker:9092",
        CAIRN_NOTHING_LIKE_IT="1",
        CAIRN_METRICS_SERVICE_HOST="10.0.0.1",
        CAIRN_TEST_TOOL_SLEEP="1",
    )
    assert done.returncode == 0, done.stderr
    assert _own_lines(done.stderr, "cairn agents list") == [
        "cairn agents list: warning: CAIRN_KAFKA_BOOTSTRAP_SERVERS is no setting, ignored "
        "(did you mean CAIRN_KAFKA__BOOTSTRAP_SERVERS?)",
        "cairn agents list: warning: CAIRN_NOTHING_LIKE_IT is no setting, ignored",
    ]


def test_the_modules_of_the_working_directory_can_host_agents(tmp_path: Path) -> None:
    """The ``cairn`` console script's import path starts at its own folder, not the working
    directory: a registry and a tool beside the agents file were not found without PYTHONPATH."""
    (tmp_path / "my_registry.py").write_text("from service.demo import agents\n")
    (tmp_path / "my_tools.py").write_text(
        "def shout(text: str) -> str:\n    '''Say it louder.'''\n    return text.upper()\n"
    )
    (tmp_path / "agents.toml").write_text(
        '[[agents]]\nname = "loud"\nmodel = "m"\ntools = ["my_tools:shout"]\n'
        'provider = { type = "openai_compat", base_url = "http://localhost:1/v1" }\n'
    )
    cairn = Path(sys.executable).with_name("cairn")
    env = _env()
    del env["PYTHONPATH"]  # the package is installed; the working directory is not on the path
    for config, shows in (("my_registry:agents", "demo-checkpointed"), ("agents.toml", "shout")):
        done = subprocess.run(
            [str(cairn), "agents", "list", "--config", config],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert shows in done.stdout
