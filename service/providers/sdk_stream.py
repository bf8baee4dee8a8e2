"""What the SDK-backed providers share: one streamed call per attempt, retries, cancel, close.

Guarantee: an attempt's HTTP stream is closed on every exit (end, error, cancel, or the caller
closing the generator early), so an immediate cancel stops token production; retries happen only
in :mod:`.retry` (the SDKs' own retries are off). A reply the provider streams in several calls
(Anthropic's ``pause_turn``) is one attempt: a retry starts it over from its first call.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from contextlib import aclosing
from typing import Any, ClassVar, Protocol

from service.agent.provider import ModelChunk, ModelProvider, ModelReply, ModelRequest, TextDelta
from service.agent.types import Usage
from service.providers.cancel_race import unless_cancelled, until_cancelled
from service.providers.config import ModelOptions, ProviderConfig
from service.providers.retry import Failure, cancelled_reply, stream_with_retries

logger = logging.getLogger(__name__)


class ReplyBuilder(Protocol):
    """Folds one provider's stream events into our reply."""

    usage: Usage

    def add(self, event: Any) -> str | None:
        """Take one stream event; return the text it adds, if any."""

    def partial_text(self) -> str: ...

    def build(self) -> ModelReply: ...


class SdkStreamingProvider(ModelProvider):
    """Base of a provider that streams through an official SDK client."""

    kind: ClassVar[str]
    config: ModelOptions
    _client: Any
    _secrets: tuple[str, ...]

    @property
    def model_name(self) -> str:
        return self.config.model_id

    def __repr__(self) -> str:
        cfg = self.config
        where = f"base_url={cfg.base_url!r}" if isinstance(cfg, ProviderConfig) else self._where()
        return f"{type(self).__name__}(model_id={cfg.model_id!r}, {where})"

    def _where(self) -> str:
        """Where the calls go, for a provider whose options have no ``base_url``."""
        return ""

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

    @abc.abstractmethod
    def request_params(self, request: ModelRequest) -> dict[str, Any]:
        """The body of one call (without ``stream``)."""

    @abc.abstractmethod
    def _open_stream(self, params: dict[str, Any]) -> Awaitable[Any]:
        """Start one streamed call; the awaitable gives the SDK's async stream."""

    @abc.abstractmethod
    def _new_builder(self) -> ReplyBuilder: ...

    @abc.abstractmethod
    def _classify(self, exc: Exception) -> Failure | None:
        """Whether a failure may be retried; None for an exception that is not the SDK's."""

    def _follow_up(self, params: dict[str, Any], builder: Any) -> dict[str, Any] | None:
        """The next call of the same reply when its stream ended part-way through it (only
        Anthropic's ``pause_turn`` does); None when the reply is complete."""
        return None

    async def _attempt(self, request: ModelRequest) -> AsyncGenerator[ModelChunk, None]:
        params: dict[str, Any] | None = self.request_params(request)
        builder = self._new_builder()
        while params is not None:
            sdk_stream = await unless_cancelled(self._open_stream(params), request.cancel)
            if sdk_stream is None:
                yield cancelled_reply(builder.partial_text(), builder.usage)
                return
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
            params = self._follow_up(params, builder)
        yield builder.build()
