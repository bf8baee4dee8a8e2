"""Chat-completions model provider on the official ``openai`` SDK (any compatible endpoint).

Guarantee: one streamed chat completion per attempt, retried only by :mod:`.retry` (the SDK's
own retries are off); an immediate cancel closes the HTTP stream so no more tokens are produced.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from service.agent.provider import ModelRequest
from service.providers.config import OpenAICompatConfig
from service.providers.extras import import_sdk
from service.providers.openai_mapping import (
    ChatReplyBuilder,
    is_context_overflow,
    to_chat_messages,
    to_chat_tools,
)
from service.providers.retry import (
    Failure,
    is_transport_error,
    parse_retry_after,
    status_is_retryable,
)
from service.providers.sdk_stream import SdkStreamingProvider

NO_API_KEY = "no-key"
"""Sent to servers without authentication, so the SDK never falls back to its environment."""

_RETRYABLE_STREAM_ERRORS = frozenset({"server_error", "rate_limit_exceeded", "overloaded"})


class OpenAICompatProvider(SdkStreamingProvider):
    """Streams chat completions from ``config.base_url`` with tool calling."""

    config: OpenAICompatConfig

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

    def _open_stream(self, params: dict[str, Any]) -> Awaitable[Any]:
        opened: Awaitable[Any] = self._client.chat.completions.create(stream=True, **params)
        return opened

    def _new_builder(self) -> ChatReplyBuilder:
        return ChatReplyBuilder()

    def _classify(self, exc: Exception) -> Failure | None:
        openai = self._openai
        if isinstance(exc, openai.APIStatusError):
            headers = exc.response.headers
            return Failure(
                retryable=status_is_retryable(exc.status_code, headers.get("x-should-retry")),
                message=f"HTTP {exc.status_code}: {_error_text(exc)}",
                retry_after=parse_retry_after(headers),
                overflow=is_context_overflow(exc.body, exc.status_code),
            )
        if isinstance(exc, openai.APIConnectionError) or is_transport_error(exc):
            return Failure(retryable=True, message=f"connection failed: {exc}")
        if isinstance(exc, openai.APIError):
            body = exc.body if isinstance(exc.body, dict) else {}
            kind = body.get("type") or body.get("code")
            return Failure(
                retryable=kind in _RETRYABLE_STREAM_ERRORS,
                message=f"stream error {kind}: {_error_text(exc)}",
                overflow=is_context_overflow(body, 400),
            )
        if isinstance(exc, openai.OpenAIError):
            return Failure(retryable=False, message=str(exc))
        return None


def _error_text(exc: Any) -> str:
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    return str(exc.message)
