"""Runs one single-node Apache Kafka broker (KRaft, combined broker and controller) from Maven jars.

Guarantee: `start` returns only once the broker answers metadata, commits a transaction and lets
a consumer group join; `stop` ends exactly the process named in the data dir's pid file.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kafka_local_config import (
    DEFAULT_DATA_DIR,
    BrokerConfig,
    BrokerError,
    ensure_jars,
    file_lock,
    new_cluster_id,
    read_text,
)
from kafka_local_ready import run_coroutine, wait_until_serving

logger = logging.getLogger("cairn.local_kafka")


@dataclass(frozen=True)
class StartResult:
    pid: int
    bootstrap: str
    already_running: bool
    formatted: bool
    seconds_to_ready: float


@dataclass(frozen=True)
class Status:
    pid: int | None
    bootstrap: str
    serving: bool
    detail: str


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (another process may still take it before we do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
        return False


def _process_alive(pid: int) -> bool:
    stat = read_text(Path(f"/proc/{pid}/stat"))
    if stat is not None:
        # A zombie has exited already; only its parent's wait() is missing.
        return stat.rsplit(")", 1)[-1].split()[0] != "Z"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_broker_of(pid: int, config: BrokerConfig) -> bool:
    """True when pid is alive and is the broker started with this data dir's properties."""
    if not _process_alive(pid):
        return False
    if not Path("/proc/self").exists():
        # No /proc (not Linux): a live pid recorded by us is the best evidence there is.
        return True
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    args = raw.split(b"\0")
    return b"kafka.Kafka" in args and str(config.properties_file).encode() in args


def _log_tail(config: BrokerConfig, lines: int = 30) -> str:
    try:
        text = config.output_file.read_text(errors="replace")
    except FileNotFoundError:
        return "(no broker output)"
    return "\n".join(text.splitlines()[-lines:])


def _die_with_parent_hook() -> Callable[[], None] | None:
    """A pre-exec hook that makes the kernel kill the child when its parent dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    # Looked up before the fork: the child must not import or load anything.
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1

    def hook() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL)

    return hook


class LocalBroker:
    """Manages the broker of one data dir; any process can stop what another one started."""

    def __init__(self, config: BrokerConfig | None = None) -> None:
        given = config or BrokerConfig()
        # The pid check matches the command line by path, so every path is made absolute once.
        self.config = dataclasses.replace(
            given, data_dir=given.data_dir.resolve(), lib_dir=given.lib_dir.resolve()
        )
        self._process: subprocess.Popen[bytes] | None = None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with file_lock(self.config.data_dir / "manager.lock"):
            yield

    def _recorded_pid(self) -> int | None:
        text = read_text(self.config.pid_file)
        if not text:
            return None
        try:
            return int(text)
        except ValueError:
            return None

    def running_pid(self) -> int | None:
        """The pid of this data dir's broker when it runs, else None."""
        pid = self._recorded_pid()
        if pid is not None and _is_broker_of(pid, self.config):
            return pid
        return None

    def start(self, timeout: float = 120.0) -> StartResult:
        config = self.config
        config.data_dir.mkdir(parents=True, exist_ok=True)
        with self._locked():
            pid = self.running_pid()
            if pid is not None:
                running = self._running_listeners()
                if running != config.properties()["listeners"]:
                    raise BrokerError(
                        f"pid=<{pid}>, listeners=<{running}> | a broker already runs from "
                        f"{config.data_dir} on other ports: stop it first"
                    )
                self.wait_ready(timeout, pid)
                logger.info("pid=<%s>, bootstrap=<%s> | already running", pid, config.bootstrap)
                return StartResult(pid, config.bootstrap, True, False, 0.0)
            if self._recorded_pid() is not None:
                logger.info("pid_file=<%s> | removing stale pid file", config.pid_file)
                config.pid_file.unlink(missing_ok=True)
            for port in config.ports:
                if _port_in_use(config.host, port):
                    raise BrokerError(
                        f"port=<{config.host}:{port}> | already in use by another process: "
                        "stop it or pick free ports with --port and --controller-port (through "
                        'make: make run KAFKA_ARGS="--port 19092 --controller-port 19093")'
                    )
            lib_dir = ensure_jars(config.lib_dir, mvn=config.mvn)
            self._write_configs()
            formatted = self._format_if_needed(lib_dir)
            launched = time.monotonic()
            pid = self._launch(lib_dir)
            try:
                self.wait_ready(timeout, pid)
            except BaseException:
                self._terminate(pid, grace=10.0)
                config.pid_file.unlink(missing_ok=True)
                raise
            elapsed = time.monotonic() - launched
            logger.info(
                "pid=<%s>, bootstrap=<%s>, seconds_to_ready=<%.2f> | broker ready",
                pid,
                config.bootstrap,
                elapsed,
            )
            return StartResult(pid, config.bootstrap, False, formatted, elapsed)

    def _running_listeners(self) -> str | None:
        for line in (read_text(self.config.properties_file) or "").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "listeners":
                return value.strip()
        return None

    def _write_configs(self) -> None:
        config = self.config
        formatted_for = read_text(config.formatted_for_file)
        wanted = f"controller={config.host}:{config.controller_port}"
        if (config.log_dir / "meta.properties").exists() and formatted_for not in (None, wanted):
            raise BrokerError(
                f"data_dir=<{config.data_dir}>, formatted_for=<{formatted_for}>, wanted=<{wanted}> "
                "| storage was formatted for another controller endpoint: use the same ports "
                "or remove the data dir"
            )
        lines = [f"{key}={value}" for key, value in sorted(config.properties().items())]
        config.properties_file.write_text("\n".join(lines) + "\n")
        config.log4j_file.write_text(config.log4j_xml())

    def _format_if_needed(self, lib_dir: Path) -> bool:
        config = self.config
        if (config.log_dir / "meta.properties").exists():
            return False
        # Without meta.properties nothing in the log dir is usable (a format that never finished).
        shutil.rmtree(config.log_dir, ignore_errors=True)
        command = [
            config.java,
            "-Xmx256m",
            "-cp",
            f"{lib_dir}/*",
            f"-Dlog4j2.configurationFile={config.log4j_file}",
            "kafka.tools.StorageTool",
            "format",
            "--standalone",
            "--cluster-id",
            new_cluster_id(),
            "--config",
            str(config.properties_file),
        ]
        if config.security is not None:
            command += config.security.format_arguments()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BrokerError(f"storage format failed:\n{done.stdout}{done.stderr}")
        config.formatted_for_file.write_text(f"controller={config.host}:{config.controller_port}\n")
        logger.info("log_dir=<%s> | storage formatted", config.log_dir)
        return True

    def _launch(self, lib_dir: Path) -> int:
        config = self.config
        if shutil.which(config.java) is None:
            raise BrokerError(f"java=<{config.java}> | not found: install Java 17 or newer")
        command = [
            config.java,
            f"-Xmx{config.heap}",
            "-Xms128m",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={config.log4j_file}",
            "-cp",
            f"{lib_dir}/*",
            "kafka.Kafka",
            str(config.properties_file),
        ]
        with config.output_file.open("ab") as output:
            output.write(f"---- start {time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode())
            output.flush()
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                cwd=config.data_dir,
                start_new_session=True,
                preexec_fn=_die_with_parent_hook() if config.die_with_parent else None,
            )
        config.pid_file.write_text(f"{self._process.pid}\n")
        return self._process.pid

    def wait_ready(self, timeout: float, pid: int | None = None) -> None:
        """Waits until metadata answers, a transaction commits and a consumer group reads it."""
        config = self.config
        watched = pid if pid is not None else self.running_pid()
        deadline = time.monotonic() + timeout

        def check_process() -> None:
            if watched is None or not _process_alive(watched):
                raise BrokerError(
                    f"bootstrap=<{config.bootstrap}> | broker process is not running; "
                    f"its output ends with:\n{_log_tail(config)}"
                )

        async def probe() -> None:
            await wait_until_serving(
                config.host, config.port, deadline, check_process, config.client_options
            )

        run_coroutine(probe)

    def stop(self, grace: float = 30.0) -> bool:
        """Stops this data dir's broker; returns False when none was running."""
        config = self.config
        if not config.data_dir.exists():
            return False
        with self._locked():
            recorded = self._recorded_pid()
            if recorded is None:
                return False
            if not _is_broker_of(recorded, config):
                logger.info("pid=<%s> | removing stale pid file, no broker runs", recorded)
                config.pid_file.unlink(missing_ok=True)
                return False
            self._terminate(recorded, grace)
            config.pid_file.unlink(missing_ok=True)
            logger.info("pid=<%s> | broker stopped", recorded)
            return True

    def _terminate(self, pid: int, grace: float) -> None:
        for sig, bound in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            if self._exited(pid, bound):
                return
            logger.warning("pid=<%s>, signal=<%s> | broker still alive after %ss", pid, sig, bound)
        raise BrokerError(f"pid=<{pid}> | broker survived SIGKILL")

    def _exited(self, pid: int, bound: float) -> bool:
        process = self._process
        if process is not None and process.pid == pid:
            try:
                process.wait(timeout=bound)
            except subprocess.TimeoutExpired:
                return False
            return True
        deadline = time.monotonic() + bound
        while _process_alive(pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def status(self, timeout: float = 10.0) -> Status:
        config = self.config
        pid = self.running_pid()
        if pid is None:
            stale = " (stale pid file)" if self._recorded_pid() is not None else ""
            return Status(None, config.bootstrap, False, f"not running{stale}")
        try:
            self.wait_ready(timeout, pid)
        except BrokerError as error:
            return Status(pid, config.bootstrap, False, f"running but not serving: {error}")
        return Status(pid, config.bootstrap, True, "serving")


def _config_from(args: argparse.Namespace) -> BrokerConfig:
    return BrokerConfig(
        data_dir=Path(args.data_dir).resolve(),
        port=args.port,
        controller_port=args.controller_port,
        host=args.host,
        heap=args.heap,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Local single-node Kafka for Cairn.")
    parser.add_argument("command", choices=["up", "down", "status", "jars"])
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    parser.add_argument("--port", type=int, default=9092)
    parser.add_argument("--controller-port", type=int, default=9093)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--heap", default="512m")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for ready")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    broker = LocalBroker(_config_from(args))
    handlers: dict[str, Callable[[], int]] = {
        "up": lambda: _cmd_up(broker, args.timeout),
        "down": lambda: _cmd_down(broker),
        "status": lambda: _cmd_status(broker),
        "jars": lambda: _cmd_jars(),
    }
    try:
        return handlers[args.command]()
    except BrokerError as error:
        print(f"kafka: {error}", file=sys.stderr)
        return 1


def _cmd_up(broker: LocalBroker, timeout: float) -> int:
    result = broker.start(timeout)
    state = "already running" if result.already_running else "started"
    print(
        f"kafka {state}: bootstrap={result.bootstrap} pid={result.pid} "
        f"seconds_to_ready={result.seconds_to_ready:.2f}"
    )
    return 0


def _cmd_down(broker: LocalBroker) -> int:
    stopped = broker.stop()
    print("kafka stopped" if stopped else "kafka was not running")
    return 0


def _cmd_status(broker: LocalBroker) -> int:
    status = broker.status()
    print(f"kafka {status.detail}: bootstrap={status.bootstrap} pid={status.pid}")
    if status.serving:
        return 0
    return 3 if status.pid is None else 1


def _cmd_jars() -> int:
    print(f"kafka jars in {ensure_jars()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
