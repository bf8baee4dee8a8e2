"""Chat-completions model provider on the official ``openai`` SDK (any compatible endpoint).

Guarantee: one streamed chat completion per attempt, retried only by :mod:`.retry` (the SDK's
own retries are off); an immediate cancel closes the HTTP stream so no more tokens are produced.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

from service.agent.provider import ModelChunk, ModelProvider, ModelRequest, TextDelta
from service.providers.cancel_race import unless_cancelled, until_cancelled
from service.providers.config import OpenAICompatConfig
from service.providers.extras import import_sdk
from service.providers.openai_mapping import ChatReplyBuilder, to_chat_messages, to_chat_tools
from service.providers.retry import (
    Failure,
    cancelled_reply,
    is_transport_error,
    parse_retry_after,
    status_is_retryable,
    stream_with_retries,
)

logger = logging.getLogger(__name__)

NO_API_KEY = "no-key"
"""Sent to servers without authentication, so the SDK never falls back to its environment."""

_RETRYABLE_STREAM_ERRORS = frozenset({"server_error", "rate_limit_exceeded", "overloaded"})


class OpenAICompatProvider(ModelProvider):
    """Streams chat completions from ``config.base_url`` with tool calling."""

    kind = "openai_compat"

    def __init__(self, config: OpenAICompatConfig, *, client: Any | None = None) -> None:
        self._openai = import_sdk("openai", "openai")
        self.config = config
        key = config.api_key.get_secret_value() if config.api_key else ""
        self._secrets = (key,) if key else ()
        self._client = client or self._openai.AsyncOpenAI(
            api_key=key or NO_API_KEY,
            base_url=config.base_url,
            organization=config.organization,
            project=config.project,
            max_retries=0,
            timeout=self._openai.Timeout(config.timeout_s, connect=config.connect_timeout_s),
        )

    def __repr__(self) -> str:
        cfg = self.config
        return f"OpenAICompatProvider(model_id={cfg.model_id!r}, base_url={cfg.base_url!r})"

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
        """The body of one chat-completions call (without ``stream``)."""
        cfg = self.config
        params: dict[str, Any] = {
            "model": cfg.model_id,
            "messages": to_chat_messages(request.messages, request.system_prompt, cfg.system_role),
        }
        if request.tool_specs:
            params["tools"] = to_chat_tools(request.tool_specs)
            if cfg.parallel_tool_calls is not None:
                params["parallel_tool_calls"] = cfg.parallel_tool_calls
        if cfg.stream_usage:
            params["stream_options"] = {"include_usage": True}
        if cfg.max_tokens is not None:
            params[cfg.max_tokens_param] = cfg.max_tokens
        if cfg.temperature is not None:
            params["temperature"] = cfg.temperature
        if cfg.top_p is not None:
            params["top_p"] = cfg.top_p
        if cfg.stop_sequences:
            params["stop"] = list(cfg.stop_sequences)
        if cfg.extra_body:
            params["extra_body"] = dict(cfg.extra_body)
        return params

    async def _attempt(self, request: ModelRequest) -> AsyncGenerator[ModelChunk, None]:
        params = self.request_params(request)
        sdk_stream = await unless_cancelled(
            self._client.chat.completions.create(stream=True, **params), request.cancel
        )
        if sdk_stream is None:
            yield cancelled_reply()
            return
        builder = ChatReplyBuilder()
        try:
            async with aclosing(until_cancelled(sdk_stream, request.cancel)) as chunks:
                async for chunk in chunks:
                    text = builder.add(chunk)
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
        openai = self._openai
        if isinstance(exc, openai.APIStatusError):
            headers = exc.response.headers
            return Failure(
                retryable=status_is_retryable(exc.status_code, headers.get("x-should-retry")),
                message=f"HTTP {exc.status_code}: {_error_text(exc)}",
                retry_after=parse_retry_after(headers),
            )
        if isinstance(exc, openai.APIConnectionError) or is_transport_error(exc):
            return Failure(retryable=True, message=f"connection failed: {exc}")
        if isinstance(exc, openai.APIError):
            body = exc.body if isinstance(exc.body, dict) else {}
            kind = body.get("type") or body.get("code")
            return Failure(
                retryable=kind in _RETRYABLE_STREAM_ERRORS,
                message=f"stream error {kind}: {_error_text(exc)}",
            )
        if isinstance(exc, openai.OpenAIError):
            return Failure(retryable=False, message=str(exc))
        return None


def _error_text(exc: Any) -> str:
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    return str(exc.message)
