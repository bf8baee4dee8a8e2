"""The wait for the broker and the topics before an instance joins its group.

Guarantees: an unreachable broker (or one that refuses the instance) and missing topics never
end the process: each failed attempt writes one WARNING line saying why and when the next comes,
the wait between attempts doubles up to a cap, and the stop event ends the wait at once. A
layout the runtime cannot run on (co-partitioned counts that disagree) ends it with
:class:`~service.runtime.topics.TopicLayoutError`, which no wait can fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Final, Protocol

from aiokafka.errors import KafkaError

from service.runtime.restart_backoff import RestartBackoff
from service.runtime.topics import MissingTopicsError, verify_topics
from service.settings import KafkaSettings, TopicSettings

logger = logging.getLogger(__name__)

FIRST_WAIT_S: Final = 0.5
MAX_WAIT_S: Final = 10.0

Waiting = Callable[[str | None], None]
"""Told why the instance waits (``None`` once it no longer does): the readiness detail."""


class StopSignal(Protocol):
    """What ends the wait: an :class:`asyncio.Event`, or the runtime's stop or drain."""

    def is_set(self) -> bool: ...

    async def wait(self) -> object: ...


async def wait_for_topics(
    kafka: KafkaSettings,
    topics: TopicSettings,
    stop: StopSignal,
    *,
    waiting: Waiting | None = None,
    backoff: RestartBackoff | None = None,
) -> int | None:
    """The co-partitioned partition count once the broker answers and every topic exists;
    ``None`` when ``stop`` was set first."""
    backoff = backoff or RestartBackoff(initial_s=FIRST_WAIT_S, cap_s=MAX_WAIT_S)
    while not stop.is_set():
        noise = BootstrapNoise()
        try:
            with noise.held_back():
                partitions = await verify_topics(kafka, topics)
        except MissingTopicsError as exc:
            reason = str(exc)
        except (KafkaError, OSError) as exc:
            cause = describe_unreachable(exc, noise.last)
            reason = f"broker {kafka.bootstrap_servers} unreachable: {cause}"
        else:
            if waiting is not None:
                waiting(None)
            if backoff.failures:
                logger.info("attempts=<%d> | broker and topics found", backoff.failures + 1)
            return partitions
        delay = backoff.failed()
        if waiting is not None:
            waiting(reason)
        logger.warning(
            "attempt=<%d>, retry_in_s=<%.1f> | not serving yet: %s",
            backoff.failures,
            delay,
            reason,
        )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await stop.wait()
    if waiting is not None:
        waiting(None)  # the wait is over (a drain, a stop): readiness no longer names its reason
    return None


def describe_unreachable(exc: BaseException, cause: str | None) -> str:
    """The error of a failed connection, with aiokafka's own account of it when there is one."""
    name, text = type(exc).__name__, str(exc)
    # aiokafka's errors already start with their class name.
    text = text if text.startswith(name) else f"{name}: {text}" if text else name
    return f"{text} ({cause})" if cause else text


class BootstrapNoise(logging.Filter):
    """Holds back aiokafka's own line for a failed connection while the wait reports it: one
    line per attempt, that line carrying the connection's error."""

    _PREFIX: Final = "Unable connect to"

    def __init__(self) -> None:
        super().__init__()
        self.last: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith(self._PREFIX):
            self.last = message
            return False
        return True

    @contextlib.contextmanager
    def held_back(self) -> Iterator[None]:
        target = logging.getLogger("aiokafka")
        target.addFilter(self)
        try:
            yield
        finally:
            target.removeFilter(self)
