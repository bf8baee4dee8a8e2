"""Loads a deployment's agents from an import path (``pkg.mod:attr``) or a TOML/YAML file.

Guarantee: either every agent is built (providers constructed, tools imported, options
validated) or :class:`AgentConfigError` says what is wrong; secrets come only from ``env`` and
are neither logged nor returned by :func:`describe_agents`.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from service.agent.definition import AgentDefinition
from service.agent.hooks import HookProvider
from service.agent.registry import load_agent_registry
from service.agent.tools import Tool
from service.agent.types import Limits
from service.agent_config.errors import AgentConfigError, describe_validation
from service.agent_config.imports import resolve_hook, resolve_tools
from service.agent_config.provider_factory import build_provider
from service.agent_config.schema import AgentSpec, DeploymentSpec

logger = logging.getLogger(__name__)

FILE_SUFFIXES = (".toml", ".yaml", ".yml")


def load_agents(source: str | Path, env: Mapping[str, str]) -> dict[str, AgentDefinition]:
    """Agents named by ``source``: an agents file path or a registry import path."""
    text = str(source)
    if isinstance(source, Path) or text.lower().endswith(FILE_SUFFIXES):
        agents = load_agents_file(Path(text), env)
    elif ":" in text:
        agents = _load_registry(text)
    else:
        raise AgentConfigError(
            f"agents source {text!r} is neither a .toml/.yaml file nor 'package.module:attribute'"
        )
    for agent in agents.values():
        logger.info(
            "agent=<%s>, provider=<%s>, tools=<%d>, checkpointing=<%s> | agent loaded",
            agent.name,
            type(agent.model).__name__,
            len(agent.tools),
            agent.checkpointing,
        )
    return agents


def _load_registry(path: str) -> dict[str, AgentDefinition]:
    try:
        return dict(load_agent_registry(path))
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise AgentConfigError(f"agent registry {path!r}: {type(exc).__name__}: {exc}") from exc


def read_spec(path: Path) -> DeploymentSpec:
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise AgentConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    data: Any
    try:
        data = tomllib.loads(raw) if path.suffix.lower() == ".toml" else yaml.safe_load(raw)
    except tomllib.TOMLDecodeError as exc:
        raise AgentConfigError(f"{path}: not valid TOML: {exc}") from None
    except yaml.YAMLError as exc:
        raise AgentConfigError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise AgentConfigError(f"{path}: the top level must be a table with an 'agents' list")
    try:
        return DeploymentSpec.model_validate(data)
    except ValidationError as exc:
        raise AgentConfigError(f"{path}: {describe_validation(exc)}") from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """Where and what, without the offending line (it could hold a pasted secret)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"{exc.problem} (at line {mark.line + 1}, column {mark.column + 1})"
    return type(exc).__name__


def load_agents_file(path: Path, env: Mapping[str, str]) -> dict[str, AgentDefinition]:
    spec = read_spec(path)
    return {
        agent.name: build_agent(agent, env, f"{path}: agent {agent.name!r}")
        for agent in spec.agents
    }


def build_agent(spec: AgentSpec, env: Mapping[str, str], where: str) -> AgentDefinition:
    model = build_provider(spec.provider, spec.model, env, where)
    tools: list[Tool] = []
    for path in spec.tools:
        try:
            tools.extend(resolve_tools(path))
        except AgentConfigError as exc:
            raise AgentConfigError(f"{where}: {exc}") from exc.__cause__
    hooks: list[HookProvider] = []
    for path in spec.hooks:
        try:
            hooks.append(resolve_hook(path))
        except AgentConfigError as exc:
            raise AgentConfigError(f"{where}: {exc}") from exc.__cause__
    try:
        return AgentDefinition(
            name=spec.name,
            model=model,
            system_prompt=spec.system_prompt,
            tools=tools,
            executor=spec.executor,
            hooks=hooks,
            checkpointing=spec.checkpointing,
            limits=Limits(**spec.limits.model_dump()),
        )
    except ValueError as exc:
        raise AgentConfigError(f"{where}: {exc}") from None


def describe_agents(agents: Mapping[str, AgentDefinition]) -> list[dict[str, Any]]:
    """What a deployment hosts, safe to print: no option carrying a secret is included."""
    out = []
    for name, agent in sorted(agents.items()):
        config = getattr(agent.model, "config", None)
        out.append(
            {
                "name": name,
                "provider": getattr(agent.model, "kind", type(agent.model).__name__),
                "model": getattr(config, "model_id", None),
                "base_url": getattr(config, "base_url", None),
                "tools": [t.name for t in agent.tools],
                "executor": agent.executor,
                "checkpointing": agent.checkpointing,
                "limits": agent.limits.to_dict(),
            }
        )
    return out
