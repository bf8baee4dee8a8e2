"""Validated options of the real model providers and of their retries.

Guarantee: an options object that exists is valid (bad values fail at construction, at start-up)
and never shows its API key: keys are ``SecretStr`` and render as ``**********``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator


class RetryConfig(BaseModel):
    """Exponential backoff with jitter; ``max_retries`` counts attempts after the first."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_retries: int = Field(default=3, ge=0, le=20)
    initial_backoff_s: float = Field(default=0.5, gt=0)
    max_backoff_s: float = Field(default=20.0, gt=0)
    max_retry_after_s: float = Field(default=60.0, ge=0)
    """A server asking to wait longer than this ends the call instead of stalling it."""


class ModelOptions(BaseModel):
    """What every real provider takes: the model, sampling, timeouts and retries."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    model_id: str = Field(min_length=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stop_sequences: tuple[str, ...] = ()
    timeout_s: float = Field(default=600.0, gt=0)
    """Read timeout between two bytes of a response (streaming keeps it from firing)."""
    connect_timeout_s: float = Field(default=10.0, gt=0)
    retry: RetryConfig = Field(default_factory=RetryConfig)


class ProviderConfig(ModelOptions):
    """Options of a provider reached over HTTP at ``base_url`` with an API key."""

    base_url: str
    extra_body: dict[str, Any] = Field(default_factory=dict)
    """Provider-specific request fields sent as they are (e.g. vLLM's ``top_k``)."""

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("base_url must start with http:// or https://")
        return value


class OpenAICompatConfig(ProviderConfig):
    """Options of any chat-completions endpoint (OpenAI, Azure OpenAI v1, vLLM, Ollama, ...)."""

    base_url: str = "https://api.openai.com/v1"
    api_key: SecretStr | None = None
    """Servers without authentication (a local vLLM or Ollama) need none."""
    organization: str | None = None
    project: str | None = None
    max_tokens: int | None = Field(default=None, gt=0)
    max_tokens_param: Literal["max_completion_tokens", "max_tokens"] = "max_completion_tokens"
    """Older compatible servers only know ``max_tokens``; OpenAI's newer models reject it."""
    parallel_tool_calls: bool | None = None
    system_role: Literal["system", "developer"] = "system"
    stream_usage: bool = True
    """Ask for the usage chunk (``stream_options.include_usage``); off for servers rejecting it."""


class AnthropicConfig(ProviderConfig):
    """Options of the Anthropic Messages API."""

    base_url: str = "https://api.anthropic.com"
    api_key: SecretStr
    max_tokens: int = Field(default=4096, gt=0)
    top_k: int | None = Field(default=None, gt=0)
    thinking_budget_tokens: int | None = Field(default=None, ge=1024)
    """Enables extended thinking with this budget; thinking blocks are kept in the history."""

    @model_validator(mode="after")
    def _thinking_fits(self) -> AnthropicConfig:
        if self.thinking_budget_tokens is not None:
            if self.thinking_budget_tokens >= self.max_tokens:
                raise ValueError("thinking_budget_tokens must be below max_tokens")
            if self.temperature is not None or self.top_k is not None:
                raise ValueError("temperature and top_k cannot be set with extended thinking")
        return self


class BedrockConfig(ModelOptions):
    """Options of Amazon Bedrock's Converse API. Credentials are never options: they come from
    the standard AWS chain (environment, shared profile, web identity, container or instance
    role)."""

    region: str | None = Field(default=None, min_length=1)
    """None: the region of the AWS configuration (``AWS_DEFAULT_REGION``, the profile)."""
    endpoint_url: str | None = None
    """Another endpoint than the region's (a VPC endpoint, a local test server)."""
    max_tokens: int | None = Field(default=None, gt=0)
    guardrail_id: str | None = Field(default=None, min_length=1)
    guardrail_version: str | None = Field(default=None, min_length=1)
    guardrail_trace: Literal["enabled", "disabled", "enabled_full"] | None = None
    additional_model_request_fields: dict[str, Any] = Field(default_factory=dict)
    """Model-specific request fields sent as they are (e.g. ``top_k``, ``thinking``)."""
    cache_system_prompt: bool = False
    """Add a cache point after the system prompt (only for models with prompt caching)."""
    cache_tools: bool = False
    """Add a cache point after the tool specs (only for models with prompt caching)."""
    max_connections: int = Field(default=100, gt=0)
    """Open HTTP connections at most: model calls streaming at once beyond it wait for one."""

    @field_validator("endpoint_url")
    @classmethod
    def _http_endpoint(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("endpoint_url must start with http:// or https://")
        return value

    @model_validator(mode="after")
    def _guardrail_complete(self) -> BedrockConfig:
        if (self.guardrail_id is None) != (self.guardrail_version is None):
            raise ValueError("guardrail_id and guardrail_version go together")
        if self.guardrail_trace is not None and self.guardrail_id is None:
            raise ValueError("guardrail_trace needs guardrail_id and guardrail_version")
        return self
