"""The operator endpoint: ``/livez``, ``/readyz``, ``/metrics`` and ``/drain`` over HTTP (aiohttp).

A component with an explicit lifecycle: the listening socket exists exactly between ``start`` and
``stop`` (or inside ``async with`` / a :meth:`HealthServer.serve` task); it starts no task of its
own outside aiohttp's server, and a failing check answers 503 instead of raising.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Final

import orjson
from aiohttp import web

from service.observability.metrics import METRICS_CONTENT_TYPE, Metrics

logger = logging.getLogger(__name__)

LIVEZ_PATH: Final = "/livez"
READYZ_PATH: Final = "/readyz"
METRICS_PATH: Final = "/metrics"
DRAIN_PATH: Final = "/drain"
ROUTES: Final = frozenset({LIVEZ_PATH, READYZ_PATH, METRICS_PATH, DRAIN_PATH})

Check = Callable[[], bool]
Detail = Callable[[], Mapping[str, Any]]
Drain = Callable[[], Awaitable[None]]

# Probes and scrapes are short; a long shutdown wait would only delay the process exit.
_SHUTDOWN_TIMEOUT_S: Final = 2.0


def _json(status: int, body: Mapping[str, Any]) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def _safe(check: Check, name: str) -> bool:
    # A probe must answer even when the check itself is broken: broken means "no".
    try:
        return bool(check())
    except Exception:
        logger.exception("check=<%s> | health check raised", name)
        return False


class HealthServer:
    """Serves health, readiness, metrics and drain for one process.

    ``readiness`` says whether every assigned partition is restored; ``liveness`` (optional)
    whether the processing loop still makes progress; ``drain`` (optional) stops taking new work
    and returns once in-flight work reached a boundary and the partitions were given back (called
    by the orchestrator's pre-stop hook).
    """

    def __init__(
        self,
        metrics: Metrics,
        *,
        readiness: Check,
        host: str = "0.0.0.0",
        port: int = 8080,
        liveness: Check | None = None,
        detail: Detail | None = None,
        drain: Drain | None = None,
    ) -> None:
        self._metrics = metrics
        self._readiness = readiness
        self._liveness = liveness
        self._detail = detail
        self._drain = drain
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None
        self._bound_port: int | None = None

    @property
    def port(self) -> int:
        """The port actually bound (useful with port 0); only valid while started."""
        if self._bound_port is None:
            raise RuntimeError("the health server is not started")
        return self._bound_port

    def build_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get(LIVEZ_PATH, self._livez)
        app.router.add_get(READYZ_PATH, self._readyz)
        app.router.add_get(METRICS_PATH, self._metrics_text)
        # GET for an orchestrator's pre-stop hook (Kubernetes' httpGet), POST for a person;
        # anything else (a HEAD of a link checker, say) is answered 405 and drains nothing.
        app.router.add_get(DRAIN_PATH, self._drain_now, allow_head=False)
        app.router.add_post(DRAIN_PATH, self._drain_now)
        return app

    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError("the health server is already started")
        runner = web.AppRunner(
            self.build_app(), access_log=None, shutdown_timeout=_SHUTDOWN_TIMEOUT_S
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, self._host, self._port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        address = runner.addresses[0]
        self._bound_port = int(address[1])
        logger.info("host=<%s>, port=<%s> | health server listening", self._host, self._bound_port)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        self._bound_port = None
        if runner is not None:
            await runner.cleanup()
            logger.info("health server stopped")

    async def serve(self) -> None:
        """Run until cancelled, for use as a TaskGroup task; the socket closes on the way out."""
        await self.start()
        try:
            await asyncio.Event().wait()
        finally:
            await self.stop()

    async def __aenter__(self) -> HealthServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _livez(self, _request: web.Request) -> web.Response:
        alive = self._liveness is None or _safe(self._liveness, "liveness")
        return _json(200 if alive else 503, {"status": "ok" if alive else "stalled"})

    async def _readyz(self, _request: web.Request) -> web.Response:
        ready = _safe(self._readiness, "readiness")
        body: dict[str, Any] = {"status": "ready" if ready else "not_ready"}
        if self._detail is not None:
            try:
                body.update(self._detail())
            except Exception:
                logger.exception("readiness detail raised")
        return _json(200 if ready else 503, body)

    async def _metrics_text(self, _request: web.Request) -> web.Response:
        return web.Response(
            body=self._metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE}
        )

    async def _drain_now(self, _request: web.Request) -> web.Response:
        if self._drain is None:
            return _json(200, {"status": "nothing_to_drain"})
        logger.info("drain requested over http")
        await self._drain()
        return _json(200, {"status": "drained"})
