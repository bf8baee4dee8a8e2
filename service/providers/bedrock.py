"""Amazon Bedrock model provider: ConverseStream on the official AWS SDK (aiobotocore).

Guarantee: one ConverseStream call per attempt, retried only by :mod:`.retry` (botocore's own
retries are off); credentials come only from the standard AWS chain, never from options; an
immediate cancel closes the HTTP response so no more tokens are produced.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

from service.agent.provider import ModelRequest
from service.providers.bedrock_mapping import (
    OVERFLOW_MESSAGES,
    BedrockReplyBuilder,
    to_bedrock_messages,
    to_bedrock_system,
    to_bedrock_tools,
)
from service.providers.config import BedrockConfig
from service.providers.extras import import_sdk
from service.providers.retry import Failure, parse_retry_after, status_is_retryable
from service.providers.sdk_stream import SdkStreamingProvider

RETRYABLE_CODES = frozenset(
    {
        "ThrottlingException",
        "TooManyRequestsException",
        "ServiceUnavailableException",
        "ServiceUnavailable",
        "InternalServerException",
        "ModelNotReadyException",
        "ModelStreamErrorException",
        "ModelTimeoutException",
    }
)
_CREDENTIAL_HINTS = {
    "ExpiredTokenException": "the AWS credentials have expired; refresh them",
    "ExpiredToken": "the AWS credentials have expired; refresh them",
    "UnrecognizedClientException": "the AWS access key is not known; check the credentials",
    "InvalidSignatureException": "the request signature was refused; check the secret key",
    "AccessDeniedException": "the AWS identity may not invoke this model (IAM or model access)",
}


class _EventStream:
    """A ConverseStream response as an async iterator whose ``close`` ends the HTTP response."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._events: AsyncIterator[Any] = aiter(stream)

    def __aiter__(self) -> _EventStream:
        return self

    async def __anext__(self) -> Any:
        return await anext(self._events)

    async def close(self) -> None:
        events = self._events
        if isinstance(events, AsyncGenerator):
            await events.aclose()
        self._stream.close()


class BedrockProvider(SdkStreamingProvider):
    """Streams Converse replies of a Bedrock model, with tool use, guardrails and caching."""

    config: BedrockConfig

    kind = "bedrock"

    def __init__(self, config: BedrockConfig, *, session: Any | None = None) -> None:
        self._aiobotocore = import_sdk("aiobotocore.session", "bedrock")
        self._botocore_config = import_sdk("aiobotocore.config", "bedrock")
        self._exceptions = import_sdk("botocore.exceptions", "bedrock")
        self.config = config
        self._secrets = ()
        self._session = session or self._aiobotocore.get_session()
        self._client: Any = None
        self._exits = AsyncExitStack()
        self._opening = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _where(self) -> str:
        cfg = self.config
        return f"region={cfg.region!r}, endpoint_url={cfg.endpoint_url!r}"

    async def aclose(self) -> None:
        self._client = None
        await self._exits.aclose()

    async def _ensure_client(self) -> Any:
        """The client, opened on first use in the running loop (its HTTP session is bound to
        one loop; a provider used from another loop opens its own)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._client = loop, None
            self._exits, self._opening = AsyncExitStack(), asyncio.Lock()
        async with self._opening:
            if self._client is None:
                cfg = self.config
                client_config = self._botocore_config.AioConfig(
                    retries={"total_max_attempts": 1, "mode": "standard"},
                    connect_timeout=cfg.connect_timeout_s,
                    read_timeout=cfg.timeout_s,
                    max_pool_connections=cfg.max_connections,
                    user_agent_extra="cairn",
                )
                self._client = await self._exits.enter_async_context(
                    self._session.create_client(
                        "bedrock-runtime",
                        region_name=cfg.region,
                        endpoint_url=cfg.endpoint_url,
                        config=client_config,
                    )
                )
            return self._client

    def request_params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of one ``converse_stream`` call."""
        cfg = self.config
        params: dict[str, Any] = {
            "modelId": cfg.model_id,
            "messages": to_bedrock_messages(request.messages, model_id=cfg.model_id),
        }
        if request.system_prompt:
            params["system"] = to_bedrock_system(
                request.system_prompt, cache=cfg.cache_system_prompt
            )
        if request.tool_specs:
            params["toolConfig"] = to_bedrock_tools(request.tool_specs, cache=cfg.cache_tools)
        inference: dict[str, Any] = {}
        if cfg.max_tokens is not None:
            inference["maxTokens"] = cfg.max_tokens
        if cfg.temperature is not None:
            inference["temperature"] = cfg.temperature
        if cfg.top_p is not None:
            inference["topP"] = cfg.top_p
        if cfg.stop_sequences:
            inference["stopSequences"] = list(cfg.stop_sequences)
        if inference:
            params["inferenceConfig"] = inference
        if cfg.guardrail_id is not None:
            guardrail = {
                "guardrailIdentifier": cfg.guardrail_id,
                "guardrailVersion": cfg.guardrail_version,
            }
            if cfg.guardrail_trace is not None:
                guardrail["trace"] = cfg.guardrail_trace
            params["guardrailConfig"] = guardrail
        if cfg.additional_model_request_fields:
            params["additionalModelRequestFields"] = dict(cfg.additional_model_request_fields)
        return params

    async def _open_stream(self, params: dict[str, Any]) -> _EventStream:
        client = await self._ensure_client()
        response = await client.converse_stream(**params)
        return _EventStream(response["stream"])

    def _new_builder(self) -> BedrockReplyBuilder:
        return BedrockReplyBuilder()

    def _classify(self, exc: Exception) -> Failure | None:
        errors = self._exceptions
        if isinstance(exc, errors.ClientError):
            return _client_error(exc, in_stream=isinstance(exc, errors.EventStreamError))
        if isinstance(exc, errors.NoCredentialsError | errors.PartialCredentialsError):
            return Failure(
                retryable=False,
                message=f"no AWS credentials: {exc} (set them in the environment, a profile, "
                "or a web identity token)",
            )
        if isinstance(exc, errors.NoRegionError):
            return Failure(
                retryable=False,
                message="no AWS region: set provider.region, AWS_DEFAULT_REGION or a profile's",
            )
        if isinstance(exc, errors.HTTPClientError | errors.ConnectionError) or _is_aiohttp(exc):
            return Failure(retryable=True, message=f"connection failed: {exc}")
        if isinstance(exc, errors.BotoCoreError):
            return Failure(retryable=False, message=str(exc))
        return None


def _client_error(exc: Any, *, in_stream: bool) -> Failure:
    response = exc.response
    error = response.get("Error") or {}
    code = str(error.get("Code") or "Error")
    if in_stream:
        # an in-stream exception is named by its event (``throttlingException``)
        code = code[:1].upper() + code[1:]
    text = str(error.get("Message") or exc)
    meta = response.get("ResponseMetadata") or {}
    status = int(meta.get("HTTPStatusCode") or 0)
    headers = meta.get("HTTPHeaders") or {}
    hint = _CREDENTIAL_HINTS.get(code)
    where = "stream error" if in_stream else f"HTTP {status}"
    message = f"{where} {code}: {text}" + (f" ({hint})" if hint else "")
    retryable = code in RETRYABLE_CODES or (
        not in_stream and hint is None and status_is_retryable(status, None)
    )
    overflow = code == "ValidationException" and any(
        part in text.lower() for part in OVERFLOW_MESSAGES
    )
    return Failure(
        retryable=retryable and not overflow,
        message=message,
        retry_after=parse_retry_after(headers) if not in_stream else None,
        overflow=overflow,
    )


def _is_aiohttp(exc: BaseException) -> bool:
    """aiohttp's errors while reading the stream (a dropped connection, a cut payload)."""
    return any(
        cls.__name__ == "ClientError" and cls.__module__.split(".")[0] == "aiohttp"
        for cls in type(exc).__mro__
    )
