"""Retries of one model call: exponential backoff with jitter, Retry-After, a deadline.

Guarantee: retryable failures (throttling, 5xx, dropped connections) are retried at most
``max_retries`` times and never past the request's deadline; every other failure, and the last
retryable one, ends the call as :class:`ModelError`. The SDKs' own retries are off, so these are
the only ones. Secrets are removed from every message that leaves this module.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass

from service.agent.errors import ContextOverflowError, ModelError
from service.agent.provider import ModelChunk, ModelReply, ModelRequest
from service.agent.types import Usage
from service.providers.config import RetryConfig

logger = logging.getLogger(__name__)


class TruncatedStreamError(Exception):
    """The response ended before the model finished its reply (a dropped stream)."""


@dataclass(frozen=True, slots=True)
class Failure:
    """How a provider judges one failed attempt."""

    retryable: bool
    message: str
    retry_after: float | None = None
    overflow: bool = False
    """The request exceeds the model's context window: never retried as it is; the engine
    reduces the context first."""


Classifier = Callable[[Exception], Failure | None]
"""Maps an exception to a :class:`Failure`; None means it is no provider failure (re-raised)."""


def backoff_delay(policy: RetryConfig, retry_index: int, rng: random.Random) -> float:
    """Equal jitter: half the exponential step fixed, half random, capped at ``max_backoff_s``."""
    step = min(policy.max_backoff_s, policy.initial_backoff_s * (2.0**retry_index))
    return step / 2 + rng.uniform(0, step / 2)


def parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date)."""
    if not headers:
        return None
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def redact(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    return text


def cancelled_reply(text: str = "", usage: Usage | None = None) -> ModelReply:
    """What a provider yields when it stops for a cancel; the engine replaces the message."""
    content = [{"text": text}] if text else []
    return ModelReply(
        message={"role": "assistant", "content": content},
        stop_reason="cancelled",
        usage=usage or Usage(),
    )


async def _sleep_unless_cancelled(delay: float, request: ModelRequest) -> bool:
    """Sleep ``delay`` seconds; True when an immediate cancel cut the sleep short."""
    cancel = request.cancel
    loop = asyncio.get_running_loop()
    until = loop.time() + delay
    while not cancel.immediate:
        remaining = until - loop.time()
        if remaining <= 0:
            return False
        if cancel.is_set:
            # a deferred cancel keeps the event set, so waiting on it would spin
            await asyncio.sleep(remaining)
            continue
        try:
            async with asyncio.timeout(remaining):
                await cancel.wait()
        except TimeoutError:
            return cancel.immediate
    return True


async def stream_with_retries(
    attempt: Callable[[], AsyncGenerator[ModelChunk, None]],
    *,
    request: ModelRequest,
    classify: Classifier,
    policy: RetryConfig,
    provider: str,
    secrets: Sequence[str] = (),
    rng: random.Random | None = None,
) -> AsyncGenerator[ModelChunk, None]:
    """Run ``attempt`` until it completes, retrying retryable failures by ``policy``.

    A retry after text was streamed starts the reply over: deltas already yielded are progress
    only, the final :class:`ModelReply` is the record.
    """
    rng = rng or random.Random()
    retries = 0
    while True:
        if request.cancel.immediate:
            yield cancelled_reply()
            return
        stream = attempt()
        try:
            async for chunk in stream:
                yield chunk
            return
        except ModelError:
            raise
        except Exception as exc:
            failure = (
                Failure(retryable=True, message=str(exc))
                if isinstance(exc, TruncatedStreamError)
                else classify(exc)
            )
            if failure is None:
                raise
            message = redact(failure.message, secrets)
            if failure.overflow:
                raise ContextOverflowError(f"{provider}: {message}") from None
            if not failure.retryable:
                raise ModelError(f"{provider}: {message}") from None
            delay = _retry_delay(failure, policy, retries, rng, request, provider, message)
            logger.warning(
                "provider=<%s>, session_id=<%s>, retry=<%d>, delay_s=<%.3f>, error=<%s> | "
                "retrying model call",
                provider,
                request.session_id,
                retries + 1,
                delay,
                message,
            )
        finally:
            await stream.aclose()
        if await _sleep_unless_cancelled(delay, request):
            yield cancelled_reply()
            return
        retries += 1


def _retry_delay(
    failure: Failure,
    policy: RetryConfig,
    retries: int,
    rng: random.Random,
    request: ModelRequest,
    provider: str,
    message: str,
) -> float:
    if retries >= policy.max_retries:
        raise ModelError(
            f"{provider}: gave up after {retries + 1} attempts: {message}", retryable=True
        )
    if failure.retry_after is not None:
        if failure.retry_after > policy.max_retry_after_s:
            raise ModelError(
                f"{provider}: server asked to retry after {failure.retry_after:.1f}s, "
                f"more than the allowed {policy.max_retry_after_s:.1f}s: {message}",
                retryable=True,
            )
        delay = failure.retry_after
    else:
        delay = backoff_delay(policy, retries, rng)
    if request.deadline is not None and time.monotonic() + delay >= request.deadline:
        raise ModelError(
            f"{provider}: no time left before the deadline to retry: {message}", retryable=True
        )
    return delay


def is_transport_error(exc: BaseException) -> bool:
    """True for the HTTP client's transport errors (dropped or refused connections, timeouts).

    Matched by class name so it holds for every SDK version, whichever httpx package it uses.
    """
    return any(
        cls.__name__ == "TransportError" and cls.__module__.split(".")[0] in ("httpx", "httpx2")
        for cls in type(exc).__mro__
    )


def status_is_retryable(status: int, should_retry: str | None) -> bool:
    """Throttling, timeouts, conflicts and 5xx, unless the server says otherwise."""
    if should_retry in ("true", "false"):
        return should_retry == "true"
    return status in (408, 409, 429) or status >= 500
