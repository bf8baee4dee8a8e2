"""Builds a model provider from an agents-file provider table plus the environment.

Guarantee: the API key is read only from the ``env`` mapping the caller passes, lands in a
``SecretStr`` and appears in no message (Bedrock takes none: the AWS SDK's credential chain
does); bad options fail here, at start-up.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, SecretStr, ValidationError

from service.agent.provider import ModelProvider
from service.agent_config.errors import AgentConfigError, describe_validation
from service.agent_config.schema import ProviderSpec
from service.providers.anthropic import AnthropicProvider
from service.providers.bedrock import BedrockProvider
from service.providers.config import AnthropicConfig, BedrockConfig, OpenAICompatConfig
from service.providers.extras import MissingExtraError
from service.providers.openai_compat import OpenAICompatProvider

_KINDS: dict[str, tuple[type[BaseModel], Callable[[Any], ModelProvider]]] = {
    "openai_compat": (OpenAICompatConfig, OpenAICompatProvider),
    "anthropic": (AnthropicConfig, AnthropicProvider),
    "bedrock": (BedrockConfig, BedrockProvider),
}


def build_provider(
    spec: ProviderSpec, model: str, env: Mapping[str, str], where: str
) -> ModelProvider:
    """The provider, or one error with every problem of it: its key and its options are checked
    apart, so an unset key does not hide a typo in the options (nor the other way round)."""
    config_type, factory = _KINDS[spec.type]
    options: dict[str, Any] = {**spec.options(), "model_id": model}
    problems = []
    takes_key = "api_key" in config_type.model_fields
    if spec.api_key_env is not None and not takes_key:
        problems.append(
            f"{where}: provider {spec.type!r} takes no api_key_env: its credentials come from "
            "the standard AWS chain (environment, profile, web identity, instance role)"
        )
    elif spec.api_key_env is not None:
        value = env.get(spec.api_key_env)
        if value is None:
            problems.append(
                f"{where}: environment variable {spec.api_key_env!r} (provider.api_key_env) "
                "is not set"
            )
        # A stand-in for a missing key lets the options be checked in the same run.
        options["api_key"] = SecretStr(_UNSET_KEY if value is None else value)
    elif takes_key and config_type.model_fields["api_key"].is_required():
        problems.append(f"{where}: provider {spec.type!r} needs api_key_env")
        options["api_key"] = SecretStr(_UNSET_KEY)
    try:
        config = config_type.model_validate(options)
    except ValidationError as exc:
        problems.append(f"{where}: bad {spec.type} options: {describe_validation(exc, 'provider')}")
    if problems:
        raise AgentConfigError(*problems)
    try:
        return factory(config)
    except MissingExtraError as exc:
        raise AgentConfigError(f"{where}: {exc}") from None


_UNSET_KEY = "unset"
"""Stands in for a key that is not set while the options are checked; never reaches a client."""
