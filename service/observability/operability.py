"""The operability bundle of one process: its metrics, its readiness and its HTTP endpoint.

Built once by the composition root and passed down; the endpoint listens exactly while the
bundle is entered (``async with``), and nothing listens when no port is configured.
"""

from __future__ import annotations

from types import TracebackType

from service.observability.http import Drain, HealthServer
from service.observability.metrics import Metrics
from service.observability.readiness import LoopHeartbeat, RestoreTracker


class Operability:
    """``metrics`` and ``readiness`` go to the runtime; entering starts the HTTP endpoint."""

    def __init__(
        self,
        *,
        port: int | None,
        host: str = "0.0.0.0",
        liveness_stale_after_s: float = 300.0,
    ) -> None:
        self.metrics = Metrics(process=True)
        self.readiness = RestoreTracker(self.metrics)
        self.heartbeat = LoopHeartbeat(liveness_stale_after_s)
        self._host = host
        self._port = port
        self._drain: Drain | None = None
        self._server: HealthServer | None = None

    def set_drain(self, drain: Drain) -> None:
        """What ``/drain`` (the orchestrator's pre-stop hook) runs; set before entering."""
        self._drain = drain

    @property
    def port(self) -> int | None:
        """The bound port while entered (useful with port 0), else None."""
        return self._server.port if self._server is not None else None

    async def __aenter__(self) -> Operability:
        if self._port is not None:
            server = HealthServer(
                self.metrics,
                readiness=self.readiness,
                detail=self.readiness.describe,
                liveness=self.heartbeat,
                drain=self._drain,
                host=self._host,
                port=self._port,
            )
            await server.start()
            self._server = server
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.readiness.stopping()
        server, self._server = self._server, None
        if server is not None:
            await server.stop()
