"""Anthropic Messages model provider on the official ``anthropic`` SDK.

Guarantee: one streamed Messages call per attempt, and one more for each time the turn is paused
(:mod:`.anthropic_pause`), retried only by :mod:`.retry` (the SDK's own retries are off); an
immediate cancel closes the HTTP stream so no more tokens are produced.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable
from typing import Any

from service.agent.provider import ModelRequest
from service.providers.anthropic_mapping import (
    PROMPT_TOO_LONG,
    AnthropicReplyBuilder,
    to_anthropic_messages,
    to_anthropic_tools,
)
from service.providers.anthropic_pause import resumed_turn
from service.providers.config import AnthropicConfig
from service.providers.extras import import_sdk
from service.providers.retry import (
    Failure,
    is_transport_error,
    parse_retry_after,
    status_is_retryable,
)
from service.providers.sdk_stream import SdkStreamingProvider

_RETRYABLE_STREAM_ERRORS = frozenset({"overloaded_error", "api_error", "rate_limit_error"})


class AnthropicProvider(SdkStreamingProvider):
    """Streams Messages API replies from ``config.base_url`` with tool use."""

    config: AnthropicConfig

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
        if cfg.stop_sequences:
            params["stop_sequences"] = list(cfg.stop_sequences)
        if cfg.thinking_budget_tokens is not None:
            params["thinking"] = {"type": "enabled", "budget_tokens": cfg.thinking_budget_tokens}
        extra = dict(cfg.extra_body or {})
        sampling = (("temperature", cfg.temperature), ("top_p", cfg.top_p), ("top_k", cfg.top_k))
        for name, value in sampling:
            if value is None:
                continue
            # Fields of the request body either way; SDK releases that dropped the keyword
            # (2.x) still send them through extra_body, for the endpoints that take them.
            if name in self._create_keywords:
                params[name] = value
            else:
                extra.setdefault(name, value)
        if extra:
            params["extra_body"] = extra
        return params

    @functools.cached_property
    def _create_keywords(self) -> frozenset[str]:
        """The keywords the installed SDK's ``messages.create`` takes."""
        create = self._anthropic.resources.messages.AsyncMessages.create
        return frozenset(inspect.signature(create).parameters)

    def _open_stream(self, params: dict[str, Any]) -> Awaitable[Any]:
        opened: Awaitable[Any] = self._client.messages.create(stream=True, **params)
        return opened

    def _new_builder(self) -> AnthropicReplyBuilder:
        return AnthropicReplyBuilder()

    def _follow_up(self, params: dict[str, Any], builder: Any) -> dict[str, Any] | None:
        return resumed_turn(params, builder)

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
                overflow=exc.status_code == 400
                and kind == "invalid_request_error"
                and text.lower().startswith(PROMPT_TOO_LONG),
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
