"""A configured ``strands.Agent`` turned into the equivalent Cairn :class:`AgentDefinition`.

Carried over: the system prompt; the tools (``@strands.tool`` functions and module tools, run as
:class:`~service.strands_adapter.tools.StrandsTool`); the model (Bedrock, Anthropic or OpenAI:
model id, inference parameters, the client's ``base_url`` and key) on the Cairn provider of the
same API; the conversation manager (sliding window, summarizing, null) as a
:class:`~service.agent.context.ContextPolicy`; the tool executor (concurrent or sequential) and
the ``checkpointing`` flag.

Guarantee: what Cairn cannot carry over (a custom hook provider or plugin, another conversation
manager or model provider, a session manager, initial messages or state, a structured output
model, client options Cairn has no counterpart for) is refused: :func:`from_strands` raises one
:class:`AgentConfigError` listing every such problem, each naming the agent, at load.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from strands import Agent
from strands.agent.conversation_manager import (
    NullConversationManager,
    SlidingWindowConversationManager,
    SummarizingConversationManager,
)
from strands.tools.decorator import DecoratedFunctionTool
from strands.tools.executors import ConcurrentToolExecutor, SequentialToolExecutor
from strands.tools.tools import PythonAgentTool

from service.agent.context import MIN_MAX_MESSAGES, ContextPolicy
from service.agent.definition import AgentDefinition, ExecutorKind
from service.agent.provider import ModelProvider
from service.agent.tools import Tool
from service.agent.types import Limits
from service.agent_config.errors import AgentConfigError, validation_problems
from service.agent_config.provider_factory import build_provider
from service.agent_config.schema import ProviderSpec
from service.strands_adapter.tools import StrandsTool

_KEY_VARIABLE = "\x00strands client api_key"
"""Where a key written in the Strands client's arguments is handed to the provider factory."""

_DEFAULT_KEY_ENV = {"openai_compat": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
"""The variables the Strands (and vendor SDK) clients read their key from by default."""

_CLIENT_ARGS = {
    "base_url": "base_url",
    "organization": "organization",
    "project": "project",
    "timeout": "timeout_s",
}
"""Client arguments with a Cairn counterpart (``api_key`` and ``max_retries`` apart)."""


def from_strands(
    agent: Agent,
    *,
    name: str,
    env: Mapping[str, str] | None = None,
    api_key_env: str | None = None,
    checkpointing: bool | None = None,
    limits: Limits | None = None,
) -> AgentDefinition:
    """The Cairn agent equivalent to ``agent``, registered as ``name``.

    The model's key: ``api_key_env`` (read from ``env``, the process environment by default),
    else an ``api_key`` in the Strands client arguments, else the vendor's usual variable
    (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``) when it is set. ``checkpointing`` defaults to the
    Strands agent's own flag.
    """
    where = f"Strands agent {name!r}"
    problems: list[str] = []
    environment = dict(os.environ if env is None else env)
    model = _collect(problems, where, lambda: _model(agent, environment, api_key_env, where))
    tools = _collect(problems, where, lambda: _tools(agent))
    executor = _collect(problems, where, lambda: _executor(agent))
    problems.extend(f"{where}: {problem}" for problem in _unsupported(agent))
    context = None
    if model is not None:
        context = _collect(problems, where, lambda: _context(agent, model, name, environment))
    if problems or model is None or tools is None or executor is None or context is None:
        raise AgentConfigError(*problems)
    try:
        return AgentDefinition(
            name=name,
            model=model,
            system_prompt=agent.system_prompt,
            tools=tools,
            executor=executor,
            checkpointing=bool(agent._checkpointing) if checkpointing is None else checkpointing,
            limits=limits or Limits(),
            context=context,
        )
    except ValueError as exc:
        raise AgentConfigError(f"{where}: {exc}") from None


def _collect(problems: list[str], where: str, build: Any) -> Any:
    """``build()``, or None with its problems added (each naming the agent)."""
    try:
        return build()
    except AgentConfigError as exc:
        problems.extend(p if p.startswith(where) else f"{where}: {p}" for p in exc.problems)
        return None


def _tools(agent: Agent) -> list[Tool]:
    tools: list[Tool] = []
    refused: list[str] = []
    for tool_name, each in agent.tool_registry.registry.items():
        if isinstance(each, DecoratedFunctionTool | PythonAgentTool):
            tools.append(StrandsTool(each))
        else:
            refused.append(
                f"tool {tool_name!r} is a {type(each).__name__}; only @strands.tool functions "
                "and module tools can be carried over"
            )
    if refused:
        raise AgentConfigError(*refused)
    return tools


def _executor(agent: Agent) -> ExecutorKind:
    executor = agent.tool_executor
    if type(executor) is ConcurrentToolExecutor:
        return "concurrent"
    if type(executor) is SequentialToolExecutor:
        return "sequential"
    raise AgentConfigError(
        f"tool executor {type(executor).__name__} cannot be carried over; Cairn runs tools "
        "concurrently or sequentially"
    )


def _unsupported(agent: Agent) -> list[str]:
    """What of the agent Cairn has no place for, one sentence each."""
    problems = [
        f"hook {owner} cannot be carried over: {hint}" for owner, hint in _custom_hooks(agent)
    ]
    if agent._session_manager is not None:
        problems.append(
            f"session manager {type(agent._session_manager).__name__} cannot be carried over: "
            "Cairn keeps sessions in its own topic"
        )
    if agent.messages:
        problems.append("initial messages cannot be carried over: a Cairn session starts empty")
    if agent.state.get():
        problems.append("initial agent state cannot be carried over: a Cairn session starts empty")
    if agent._default_structured_output_model is not None:
        problems.append("a structured output model cannot be carried over")
    return problems


def _custom_hooks(agent: Agent) -> list[tuple[str, str]]:
    """The hook callbacks not registered by the Strands SDK itself: (owner, why)."""
    found: dict[str, str] = {}
    for entries in agent.hooks._registered_callbacks.values():
        for entry in entries:
            callback = entry.callback
            owner = getattr(callback, "__self__", None)
            module = type(owner).__module__ if owner is not None else callback.__module__
            if module == "strands" or module.startswith("strands."):
                continue
            label = (
                type(owner).__name__
                if owner is not None
                else getattr(callback, "__qualname__", "?")
            )
            found.setdefault(
                label,
                "write it as a Cairn hook provider (service.agent.hooks) and add it to the "
                "definition",
            )
    return list(found.items())


def _context(
    agent: Agent, model: ModelProvider, name: str, env: Mapping[str, str]
) -> ContextPolicy:
    manager = agent.conversation_manager
    if getattr(manager, "_compression_threshold", None) is not None:
        raise AgentConfigError(
            "proactive_compression cannot be carried over: Cairn reduces the view when the "
            "model reports an overflow"
        )
    if getattr(manager, "pin_first", None) is not None:
        raise AgentConfigError("pin_first cannot be carried over")
    if type(manager) is NullConversationManager:
        return ContextPolicy("none")
    if type(manager) is SlidingWindowConversationManager:
        if manager.window_size < MIN_MAX_MESSAGES:
            raise AgentConfigError(
                f"window_size {manager.window_size} is below Cairn's smallest window "
                f"({MIN_MAX_MESSAGES} messages, one tool cycle)"
            )
        return ContextPolicy("sliding_window", max_messages=manager.window_size)
    if type(manager) is SummarizingConversationManager:
        return _summarize(manager, model, name, env)
    raise AgentConfigError(
        f"conversation manager {type(manager).__name__} cannot be carried over; Cairn has "
        "SlidingWindowConversationManager, SummarizingConversationManager and "
        "NullConversationManager"
    )


def _summarize(
    manager: SummarizingConversationManager,
    model: ModelProvider,
    name: str,
    env: Mapping[str, str],
) -> ContextPolicy:
    summarizer: AgentDefinition | None = None
    if manager.summarization_agent is not None:
        summarizer = from_strands(manager.summarization_agent, name=f"{name}.summarizer", env=env)
    elif manager.summarization_system_prompt is not None:
        summarizer = AgentDefinition(
            name=f"{name}.summarizer",
            model=model,
            system_prompt=manager.summarization_system_prompt,
        )
    keep = manager.preserve_recent_messages
    try:
        return ContextPolicy(
            "summarize",
            max_messages=max(keep + 2, ContextPolicy().max_messages),
            keep_recent=keep,
            summarizer=summarizer,
        )
    except ValueError as exc:
        raise AgentConfigError(str(exc)) from None


# The model.


def _model(agent: Agent, env: dict[str, str], api_key_env: str | None, where: str) -> ModelProvider:
    model = agent.model
    kind = type(model).__name__
    if kind == "OpenAIModel" and type(model).__module__ == "strands.models.openai":
        provider, options, model_id, client_args = "openai_compat", *_openai(model)
    elif kind == "AnthropicModel" and type(model).__module__ == "strands.models.anthropic":
        provider, options, model_id, client_args = "anthropic", *_anthropic(model)
    elif kind == "BedrockModel" and type(model).__module__ == "strands.models.bedrock":
        return _bedrock(model, env, where)
    else:
        raise AgentConfigError(
            f"model provider {kind} cannot be carried over; Cairn runs Strands agents on "
            "BedrockModel, AnthropicModel and OpenAIModel"
        )
    key_env = _key(provider, client_args, env, api_key_env)
    return _build(provider, {**options, "api_key_env": key_env}, model_id, env, where)


def _build(
    provider: str, options: dict[str, Any], model_id: str, env: Mapping[str, str], where: str
) -> ModelProvider:
    options = {k: v for k, v in options.items() if v is not None}
    try:
        spec = ProviderSpec.model_validate({"type": provider, **options})
    except ValidationError as exc:
        raise AgentConfigError(*validation_problems(exc, "model")) from None
    return build_provider(spec, model_id, env, where)


def _key(
    provider: str, client_args: dict[str, Any], env: dict[str, str], api_key_env: str | None
) -> str | None:
    if api_key_env is not None:
        return api_key_env
    written = client_args.get("api_key")
    if isinstance(written, str) and written:
        env[_KEY_VARIABLE] = written
        return _KEY_VARIABLE
    default = _DEFAULT_KEY_ENV[provider]
    return default if default in env else None


def _client_options(client_args: dict[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    unknown = []
    for key, value in client_args.items():
        if key in _CLIENT_ARGS:
            options[_CLIENT_ARGS[key]] = value
        elif key == "max_retries":
            options["retry"] = {"max_retries": value}
        elif key != "api_key":
            unknown.append(key)
    if unknown:
        raise AgentConfigError(
            f"client_args {sorted(unknown)} cannot be carried over; Cairn's providers take "
            "api_key, base_url, organization, project, timeout and max_retries"
        )
    return options


def _openai(model: Any) -> tuple[dict[str, Any], str, dict[str, Any]]:
    if getattr(model, "_custom_client", None) is not None:
        raise AgentConfigError("an OpenAIModel built on a client object cannot be carried over")
    if getattr(model, "_bedrock_mantle_config", None) is not None:
        raise AgentConfigError("bedrock_mantle_config cannot be carried over")
    config = model.get_config()
    client_args = dict(model.client_args or {})
    options = _client_options(client_args)
    params = dict(config.get("params") or {})
    for name in ("temperature", "top_p", "parallel_tool_calls"):
        options[name] = params.pop(name, None)
    for name in ("max_completion_tokens", "max_tokens"):
        if name in params:
            options["max_tokens"] = params.pop(name)
            options["max_tokens_param"] = name
    stop = params.pop("stop", None)
    if stop is not None:
        options["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if params:
        options["extra_body"] = params
    return options, str(config["model_id"]), client_args


def _anthropic(model: Any) -> tuple[dict[str, Any], str, dict[str, Any]]:
    config = dict(model.get_config())
    for name in ("cache_config", "cache_tools", "anthropic_tools"):
        if config.get(name):
            raise AgentConfigError(f"AnthropicModel {name} cannot be carried over")
    # The Strands AnthropicModel keeps only the client its arguments built.
    client = model.client
    client_args: dict[str, Any] = {"api_key": client.api_key}
    options: dict[str, Any] = {"base_url": str(client.base_url).rstrip("/")}
    options["max_tokens"] = config.get("max_tokens")
    params = dict(config.get("params") or {})
    for name in ("temperature", "top_p", "top_k", "stop_sequences"):
        options[name] = params.pop(name, None)
    thinking = params.pop("thinking", None)
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        options["thinking_budget_tokens"] = thinking.get("budget_tokens")
    elif thinking is not None:
        params["thinking"] = thinking
    if params:
        options["extra_body"] = params
    return options, str(config["model_id"]), client_args


_BEDROCK_OPTIONS = (
    "temperature",
    "top_p",
    "max_tokens",
    "stop_sequences",
    "guardrail_id",
    "guardrail_version",
    "guardrail_trace",
)
_BEDROCK_IGNORED = ("model_id", "include_tool_result_status", "streaming")
"""Strands' defaults Cairn's provider has as its own behaviour (it always streams)."""


def _bedrock(model: Any, env: Mapping[str, str], where: str) -> ModelProvider:
    options = bedrock_options(model)
    return _build("bedrock", options, str(model.get_config()["model_id"]), env, where)


def bedrock_options(model: Any) -> dict[str, Any]:
    """The ``bedrock`` provider options of a Strands ``BedrockModel`` (credentials aside: the
    provider takes them from the AWS chain, as the model's own boto3 session does)."""
    config = dict(model.get_config())
    options: dict[str, Any] = {name: config.pop(name, None) for name in _BEDROCK_OPTIONS}
    options["additional_model_request_fields"] = config.pop("additional_request_fields", None)
    options["cache_system_prompt"] = bool(config.pop("cache_prompt", None)) or None
    options["cache_tools"] = bool(config.pop("cache_tools", None)) or None
    cache = config.pop("cache_config", None)
    if cache is not None:
        timed = (cache.ttl, cache.system_prompt_ttl, cache.tools_ttl, cache.cache_key)
        if cache.ttl or cache.cache_key or any(isinstance(v, str) for v in timed[1:3]):
            raise AgentConfigError(
                "BedrockModel cache_config TTLs and cache keys cannot be carried over; "
                "Cairn's cache points have the model's default duration"
            )
        options["cache_system_prompt"] = cache.system_prompt_ttl is True or None
        options["cache_tools"] = cache.tools_ttl is True or options["cache_tools"]
    for name in _BEDROCK_IGNORED:
        config.pop(name, None)
    unknown = sorted(name for name, value in config.items() if value not in (None, False))
    if unknown:
        raise AgentConfigError(f"BedrockModel options {unknown} cannot be carried over")
    meta = model.client.meta
    options["region"] = meta.region_name
    if meta.endpoint_url != f"https://bedrock-runtime.{meta.region_name}.amazonaws.com":
        options["endpoint_url"] = meta.endpoint_url
    return {name: value for name, value in options.items() if value is not None}
