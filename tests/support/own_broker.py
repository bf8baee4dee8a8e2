"""A broker of one test's own, which that test may stop cleanly, kill -9 and start again on the
same data dir and ports (the shared broker of the suite must never be restarted).

Guarantee: ``start`` returns only once the broker serves transactions and groups again; ``stop``
and ``kill`` return only once the broker process has exited; the process is killed with the
test process if that dies first, and stopped when the ``own_broker`` context ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import signal
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
LOCAL_KAFKA_DIR = REPO / "deploy" / "local-kafka"
KAFKA_DIR_ENV = "CAIRN_TEST_KAFKA_DIR"
"""Where brokers started by tests keep their data, so that CI finds and stops them."""

FAST_TRANSACTION_CLEANUP: Mapping[str, str] = {
    # Transactions the coordinator knows of and that outlived their timeout are aborted within
    # a second instead of ten, so a test that waits for that waits less.
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
}


def _kafka_local() -> ModuleType:
    if str(LOCAL_KAFKA_DIR) not in sys.path:
        sys.path.insert(0, str(LOCAL_KAFKA_DIR))
    return importlib.import_module("kafka_local")


class OwnBroker:
    """One single-node broker on fixed ports and a fixed data dir for its whole life."""

    def __init__(self, local: Any, kafka_local: ModuleType) -> None:
        self._local = local
        self._kafka_local = kafka_local

    @property
    def bootstrap(self) -> str:
        return str(self._local.config.bootstrap)

    @property
    def ssl_bootstrap(self) -> str:
        """The SASL_SSL listener of a broker started with ``security``."""
        config = self._local.config
        assert config.security is not None, "a broker without security has no SASL_SSL listener"
        return f"{config.host}:{config.security.ssl_port}"

    @property
    def mtls_bootstrap(self) -> str:
        """The SSL listener (client certificates) of a broker started with ``security``."""
        config = self._local.config
        assert config.security is not None, "a broker without security has no SSL listener"
        return f"{config.host}:{config.security.mtls_port}"

    @property
    def data_dir(self) -> Path:
        return Path(self._local.config.data_dir)

    @property
    def log_dir(self) -> Path:
        """The broker's ``log.dirs``: one folder of segments per partition."""
        return Path(self._local.config.log_dir)

    @property
    def output(self) -> Path:
        """What the broker printed, every run appended after a ``---- start`` line."""
        return Path(self._local.config.output_file)

    @property
    def pid(self) -> int | None:
        pid: int | None = self._local.running_pid()
        return pid

    def start(self, timeout: float = 180.0) -> None:
        """Start (again) and wait until the broker serves; call it from the main thread.

        The hook that kills the broker with its parent is bound to the thread that forks it, so
        a broker forked from a worker thread would die with that thread.
        """
        self._local.start(timeout=timeout)

    def stop(self, grace: float = 60.0) -> None:
        """Controlled shutdown (SIGTERM), waiting for the process to exit."""
        if not self._local.stop(grace=grace):
            raise AssertionError(f"no broker was running in {self.data_dir}")

    def kill(self) -> None:
        """SIGKILL the broker and wait for the process to exit (no controlled shutdown)."""
        pid = self.pid
        if pid is None:
            raise AssertionError(f"no broker was running in {self.data_dir}")
        os.kill(pid, signal.SIGKILL)
        # Reaps the process when this test started it, else polls until it is gone.
        if not self._local._exited(pid, 30.0):
            raise AssertionError(f"pid=<{pid}> | broker survived SIGKILL")
        self._local.config.pid_file.unlink(missing_ok=True)

    def close(self) -> None:
        with contextlib.suppress(self._kafka_local.BrokerError):
            self._local.stop(grace=30.0)

    def runs(self) -> list[str]:
        """The broker's output split by run (one entry per start)."""
        text = self.output.read_text(errors="replace") if self.output.exists() else ""
        return [chunk for chunk in text.split("---- start ") if chunk.strip()]


def _free_ports(kafka_local: ModuleType, count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port: int = kafka_local.free_port()
        if port not in ports:
            ports.append(port)
    return ports


@contextlib.contextmanager
def own_broker(
    fallback_base: Path,
    extra_properties: Mapping[str, str] | None = None,
    *,
    fast_transaction_cleanup: bool = True,
    security: Any = None,
) -> Iterator[OwnBroker]:
    """Start a broker for the caller alone; it is stopped when the context ends.

    ``security`` (a ``kafka_local_config.BrokerSecurity``, its ``ssl_port`` and ``mtls_port``
    taken from free ports here) replaces the plaintext listener with authenticated ones and
    turns on ACLs.

    Its data goes under ``$CAIRN_TEST_KAFKA_DIR`` when that is set (CI stops what it finds
    there), else under ``fallback_base``. The suite's shared broker is one too, started with the
    broker's own defaults (``fast_transaction_cleanup=False``).
    """
    kafka_local = _kafka_local()
    env_base = os.environ.get(KAFKA_DIR_ENV)
    base = Path(env_base) if env_base else fallback_base
    base.mkdir(parents=True, exist_ok=True)
    properties = {
        **(FAST_TRANSACTION_CLEANUP if fast_transaction_cleanup else {}),
        **(extra_properties or {}),
    }
    attempts = 3
    for attempt in range(1, attempts + 1):
        port, controller_port, ssl_port, mtls_port = _free_ports(kafka_local, 4)
        secured = (
            None
            if security is None
            else dataclasses.replace(security, ssl_port=ssl_port, mtls_port=mtls_port)
        )
        config = kafka_local.BrokerConfig(
            data_dir=Path(tempfile.mkdtemp(prefix="own-broker-", dir=base)),
            port=port,
            controller_port=controller_port,
            die_with_parent=True,
            extra_properties=properties,
            security=secured,
        )
        broker = OwnBroker(kafka_local.LocalBroker(config), kafka_local)
        try:
            broker.start()
        except kafka_local.BrokerError as error:
            # A free port can be taken by another process between the probe and the bind.
            if attempt == attempts or "in use" not in str(error):
                raise
            continue
        try:
            yield broker
        finally:
            broker.close()
        return
