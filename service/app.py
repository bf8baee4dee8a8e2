"""The composition root: builds the runtime from the settings and runs it until SIGTERM.

Guarantees: nothing starts before the agents are loaded; the operator endpoint (health,
readiness, metrics, drain) listens before the broker is first reached and for as long as the
runtime runs, so probes answer while the instance waits for its broker; a health port that
cannot be bound is a :class:`StartError`; a SIGTERM or SIGINT drains every owned partition
(bounded by the revoke grace period) and leaves the group before the process exits, or ends the
wait for the broker at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import tempfile
from collections.abc import Mapping

from aiokafka.errors import InvalidSessionTimeoutError, KafkaError

from service.agent.definition import AgentDefinition
from service.agent_config import load_agents
from service.observability.logs import configure_logging
from service.observability.operability import Operability
from service.observability.trace_export import TracingSetupError, configure_tracing
from service.runtime.runtime import Runtime, SettingRefused
from service.runtime.startup import BootstrapNoise, describe_unreachable
from service.runtime.topics import create_topics
from service.settings import Settings, process_environment, unknown_settings

logger = logging.getLogger(__name__)


class StartError(RuntimeError):
    """The instance cannot start as configured (e.g. its health port is taken): one line for
    the operator, never a traceback."""


def check_store_dir(settings: Settings) -> None:
    """The local store's folder can be made and written to (each partition's owner creates its
    files there); else a :class:`StartError`, before the instance joins the group."""
    root = settings.sessions.store_dir
    if root is None:
        return
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".cairn-probe-"):
            pass
    except OSError as exc:
        raise StartError(
            f"the local store's folder {str(root)!r} cannot be used (CAIRN_SESSIONS__STORE_DIR): "
            f"{exc.strerror or exc}"
        ) from None


async def serve(settings: Settings) -> None:
    check_store_dir(settings)
    agents = load_agents(settings.agents, process_environment())
    _tune_gc()
    ops = Operability(port=settings.health_port, host=settings.health_host)
    runtime = Runtime(settings, agents, operability=ops)
    ops.set_drain(runtime.drain)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with contextlib.AsyncExitStack() as stack:
            try:
                await stack.enter_async_context(ops)
            except OSError as exc:
                where, named = f"{settings.health_port}", "CAIRN_HEALTH_PORT"
                if "health_host" in settings.model_fields_set:
                    where, named = f"{settings.health_host}:{where}", f"CAIRN_HEALTH_HOST, {named}"
                raise StartError(
                    f"health port {where} cannot be bound ({named}): {exc.strerror or exc}"
                ) from None
            # Agents loaded and the endpoint up; the broker and the topics are looked for next.
            logger.info("agents=<%s> | started", sorted(agents))
            try:
                await runtime.run(stop)
            except* InvalidSessionTimeoutError:
                raise StartError(session_timeout_refused(settings)) from None
            except* SettingRefused as refused:
                raise StartError(str(refused.exceptions[0])) from None
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await close_models(agents)
    logger.info("stopped")


def session_timeout_refused(settings: Settings) -> str:
    """The broker refused to join the group with this session timeout: outside its bounds."""
    return (
        f"the broker refuses CAIRN_GROUP__SESSION_TIMEOUT_MS ({settings.group.session_timeout_ms}"
        " ms): it takes only what lies within its group.min.session.timeout.ms and "
        "group.max.session.timeout.ms (6000 and 1800000 ms unless set otherwise)"
    )


async def close_models(agents: Mapping[str, AgentDefinition]) -> None:
    """Release the model providers' HTTP clients (an aiohttp session left open at exit is
    reported as an error); a provider that fails to close is logged and the others still are."""
    for name, definition in agents.items():
        close = getattr(definition.model, "aclose", None)
        if close is None:
            continue
        try:
            await close()
        except Exception:
            logger.warning("agent=<%s> | model client did not close", name, exc_info=True)


def _tune_gc() -> None:
    """Fewer, cheaper garbage collections: full collections of a process holding many session
    states stalled the event loop for hundreds of milliseconds under load (measured), and the
    runtime creates little cyclic garbage. Everything loaded so far is never collected."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


def warn_unknown_settings(environ: Mapping[str, str]) -> None:
    """One warning naming every ``CAIRN_`` variable that sets nothing, with what it likely
    meant: one line for them all, as the repeat limit would cut separate lines short."""
    unknown = unknown_settings(environ)
    if unknown:
        named = ", ".join(f"{name} (meant {meant})" if meant else name for name, meant in unknown)
        logger.warning("variables=<%s> | no such settings: ignored", named)


def warn_fault_settings(settings: Settings) -> None:
    """One warning naming the ``CAIRN_FAULTS__*`` settings given: they make the process kill,
    stop or fail itself on purpose, for the fault tests, and have no place in production."""
    given = sorted(settings.faults.model_fields_set)
    if given:
        named = ", ".join(f"CAIRN_FAULTS__{name.upper()}" for name in given)
        logger.warning("variables=<%s> | fault injection set: for tests only", named)


def run_service(settings: Settings) -> None:
    configure_logging(
        settings.log_level,
        fmt="json" if settings.log_json else "text",
        repeat_limit=settings.log_repeat_limit,
        repeat_interval_s=settings.log_repeat_interval_s,
    )
    warn_unknown_settings(process_environment())
    warn_fault_settings(settings)
    try:
        configure_tracing(process_environment())
    except TracingSetupError as exc:
        raise StartError(str(exc)) from None
    asyncio.run(serve(settings))


def run_topics_create(settings: Settings) -> dict[str, str]:
    """Create the missing topics; an unreachable broker is a :class:`StartError`."""
    noise = BootstrapNoise()
    try:
        with noise.held_back():
            return asyncio.run(create_topics(settings.kafka, settings.topics))
    except (KafkaError, OSError) as exc:
        raise StartError(
            f"broker {settings.kafka.bootstrap_servers} unreachable: "
            f"{describe_unreachable(exc, noise.last)}"
        ) from None
