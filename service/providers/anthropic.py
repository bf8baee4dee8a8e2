"""Anthropic Messages model provider on the official ``anthropic`` SDK.

Guarantee: one streamed Messages call per attempt, retried only by :mod:`.retry` (the SDK's own
retries are off); an immediate cancel closes the HTTP stream so no more tokens are produced.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

from service.agent.provider import ModelChunk, ModelProvider, ModelRequest, TextDelta
from service.providers.anthropic_mapping import (
    AnthropicReplyBuilder,
    to_anthropic_messages,
    to_anthropic_tools,
)
from service.providers.cancel_race import unless_cancelled, until_cancelled
from service.providers.config import AnthropicConfig
from service.providers.extras import import_sdk
from service.providers.retry import (
    Failure,
    cancelled_reply,
    is_transport_error,
    parse_retry_after,
    status_is_retryable,
    stream_with_retries,
)

logger = logging.getLogger(__name__)

_RETRYABLE_STREAM_ERRORS = frozenset({"overloaded_error", "api_error", "rate_limit_error"})


class AnthropicProvider(ModelProvider):
    """Streams Messages API replies from ``config.base_url`` with tool use."""

    kind = "anthropic"

    def __init__(self, config: AnthropicConfig, *, client: Any | None = None) -> None:
        self._anthropic = import_sdk("anthropic", "anthropic")
        self.config = config
        key = config.api_key.get_secret_value()
        self._secrets = (key,)
        self._client = client or self._anthropic.AsyncAnthropic(
            api_key=key,
            base_url=config.base_url,
            max_retries=0,
            timeout=self._anthropic.Timeout(config.timeout_s, connect=config.connect_timeout_s),
        )

    def __repr__(self) -> str:
        cfg = self.config
        return f"AnthropicProvider(model_id={cfg.model_id!r}, base_url={cfg.base_url!r})"

    async def aclose(self) -> None:
        await self._client.close()

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        chunks = stream_with_retries(
            lambda: self._attempt(request),
            request=request,
            classify=self._classify,
            policy=self.config.retry,
            provider=self.kind,
            secrets=self._secrets,
        )
        async with aclosing(chunks):
            async for chunk in chunks:
                yield chunk

    def request_params(self, request: ModelRequest) -> dict[str, Any]:
        """The body of one Messages call (without ``stream``)."""
        cfg = self.config
        params: dict[str, Any] = {
            "model": cfg.model_id,
            "max_tokens": cfg.max_tokens,
            "messages": to_anthropic_messages(request.messages),
        }
        if request.system_prompt:
            params["system"] = request.system_prompt
        if request.tool_specs:
            params["tools"] = to_anthropic_tools(request.tool_specs)
        if cfg.temperature is not None:
            params["temperature"] = cfg.temperature
        if cfg.top_p is not None:
            params["top_p"] = cfg.top_p
        if cfg.top_k is not None:
            params["top_k"] = cfg.top_k
        if cfg.stop_sequences:
            params["stop_sequences"] = list(cfg.stop_sequences)
        if cfg.thinking_budget_tokens is not None:
            params["thinking"] = {"type": "enabled", "budget_tokens": cfg.thinking_budget_tokens}
        if cfg.extra_body:
            params["extra_body"] = dict(cfg.extra_body)
        return params

    async def _attempt(self, request: ModelRequest) -> AsyncGenerator[ModelChunk, None]:
        params = self.request_params(request)
        sdk_stream = await unless_cancelled(
            self._client.messages.create(stream=True, **params), request.cancel
        )
        if sdk_stream is None:
            yield cancelled_reply()
            return
        builder = AnthropicReplyBuilder()
        try:
            async with aclosing(until_cancelled(sdk_stream, request.cancel)) as events:
                async for event in events:
                    text = builder.add(event)
                    if text:
                        yield TextDelta(text)
        finally:
            await sdk_stream.close()
        if request.cancel.immediate:
            logger.info("session_id=<%s> | model stream closed by cancel", request.session_id)
            yield cancelled_reply(builder.partial_text(), builder.usage)
            return
        yield builder.build()

    def _classify(self, exc: Exception) -> Failure | None:
        anthropic = self._anthropic
        if isinstance(exc, anthropic.APIStatusError):
            kind, text = _error_fields(exc)
            if exc.status_code < 400:
                # an ``event: error`` inside a 200 stream, e.g. overloaded_error
                return Failure(
                    retryable=kind in _RETRYABLE_STREAM_ERRORS,
                    message=f"stream error {kind}: {text}",
                )
            headers = exc.response.headers
            return Failure(
                retryable=status_is_retryable(exc.status_code, headers.get("x-should-retry")),
                message=f"HTTP {exc.status_code} {kind}: {text}",
                retry_after=parse_retry_after(headers),
            )
        if isinstance(exc, anthropic.APIConnectionError) or is_transport_error(exc):
            return Failure(retryable=True, message=f"connection failed: {exc}")
        if isinstance(exc, anthropic.AnthropicError):
            return Failure(retryable=False, message=str(exc))
        return None


def _error_fields(exc: Any) -> tuple[str, str]:
    """``(error.type, error.message)`` of an official error body, or best effort."""
    body = exc.body
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("type", "error")), str(error.get("message", exc.message))
    return "error", str(exc.message)
