"""Loads a deployment's agents from an import path (``pkg.mod:attr``) or a TOML/YAML file.

Guarantee: either every agent is built (providers constructed, tools imported, options
validated) or :class:`AgentConfigError` lists every problem of every agent at once; secrets come
only from ``env`` and are neither logged nor returned by :func:`describe_agents`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from service.agent.context import ContextPolicy
from service.agent.definition import AgentDefinition
from service.agent.hooks import HookProvider
from service.agent.provider import ModelProvider
from service.agent.registry import load_agent_registry
from service.agent.tools import Tool
from service.agent.types import Limits
from service.agent_config.errors import AgentConfigError, validation_problems
from service.agent_config.imports import resolve_hook
from service.agent_config.provider_factory import build_provider
from service.agent_config.schema import AgentSpec, DeploymentSpec, duplicate_names
from service.agent_config.tool_entries import build_tools

logger = logging.getLogger(__name__)

FILE_SUFFIXES = (".toml", ".yaml", ".yml")


def load_agents(source: str | Path, env: Mapping[str, str]) -> dict[str, AgentDefinition]:
    """Agents named by ``source``: an agents file path or a registry import path. The modules
    their import paths name are looked for in the installed packages, then in the working
    directory, as a person who writes ``myagents:registry`` beside the file expects."""
    modules_of_the_working_directory()
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


def modules_of_the_working_directory() -> None:
    """Make the working directory's modules importable, after everything else on the path: a
    console script's path starts at its own folder, not the working directory (as ``python -m``
    would), and a module there must not hide an installed package of the same name."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.append(here)


def _load_registry(path: str) -> dict[str, AgentDefinition]:
    try:
        return dict(load_agent_registry(path))
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise AgentConfigError(f"agent registry {path!r}: {type(exc).__name__}: {exc}") from exc


def read_document(path: Path) -> dict[str, Any]:
    """The file parsed (TOML or YAML), not yet validated; a file that cannot be read stops here."""
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
    return data


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """Where and what, without the offending line (it could hold a pasted secret)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"{exc.problem} (at line {mark.line + 1}, column {mark.column + 1})"
    return type(exc).__name__


def agent_specs(path: Path, data: dict[str, Any]) -> tuple[list[AgentSpec], list[str]]:
    """The file's valid agents (first of each name), and the schema problems of all the rest."""
    try:
        return DeploymentSpec.model_validate(data).agents, []
    except ValidationError as exc:
        problems = [f"{path}: {problem}" for problem in validation_problems(exc)]
    # The valid agents are still built, so that their own problems are reported in this run too.
    items = data.get("agents")
    items = items if isinstance(items, list) else []
    specs: list[AgentSpec] = []
    for item in items:
        try:
            specs.append(AgentSpec.model_validate(item))
        except ValidationError:
            continue  # reported above, with its position in the list
    if len(specs) < len(items):
        # The file's own name check runs only when every agent is valid: make up for it.
        names = [item.get("name") for item in items if isinstance(item, dict)]
        twice = duplicate_names(name for name in names if isinstance(name, str))
        problems.extend(f"{path}: agents: {problem}" for problem in twice)
    unique: dict[str, AgentSpec] = {}
    for spec in specs:
        unique.setdefault(spec.name, spec)
    return list(unique.values()), problems


def load_agents_file(path: Path, env: Mapping[str, str]) -> dict[str, AgentDefinition]:
    """Every agent of the file, or one error listing every problem of every agent."""
    specs, problems = agent_specs(path, read_document(path))
    agents: dict[str, AgentDefinition] = {}
    for spec in specs:
        try:
            agents[spec.name] = build_agent(spec, env, f"{path}: agent {spec.name!r}")
        except AgentConfigError as exc:
            problems.extend(exc.problems)
    for spec in specs:
        problems.extend(_attach_summarizer(spec, specs, agents, f"{path}: agent {spec.name!r}"))
    if problems:
        raise AgentConfigError(*problems)
    return agents


def build_agent(spec: AgentSpec, env: Mapping[str, str], where: str) -> AgentDefinition:
    """The agent, or one error with every problem of it: provider, each tool, each hook."""
    problems: list[str] = []
    model: ModelProvider | None = None
    try:
        model = build_provider(spec.provider, spec.model, env, where)
    except AgentConfigError as exc:
        problems.extend(exc.problems)
    tools: list[Tool] = []
    for index, entry in enumerate(spec.tools):
        try:
            tools.extend(build_tools(entry, index))
        except AgentConfigError as exc:
            problems.extend(f"{where}: {problem}" for problem in exc.problems)
    hooks: list[HookProvider] = []
    for path in spec.hooks:
        try:
            hooks.append(resolve_hook(path))
        except AgentConfigError as exc:
            problems.extend(f"{where}: {problem}" for problem in exc.problems)
    context: ContextPolicy | None = None
    try:
        # Checked beside the others, so one run reports every problem of the agent.
        context = _context_policy(spec)
    except ValueError as exc:
        problems.append(f"{where}: {exc}")
    if problems or model is None or context is None:
        raise AgentConfigError(*problems)
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
            context=context,
        )
    except ValueError as exc:
        raise AgentConfigError(f"{where}: {exc}") from None


def _attach_summarizer(
    spec: AgentSpec, specs: list[AgentSpec], agents: dict[str, AgentDefinition], where: str
) -> list[str]:
    """Give the agent the summarizer its file names (another agent of the same file). The name
    is checked against the file's agents whether or not either was built, so a bad name shows up
    in the same run as the agents' other problems (those are reported already)."""
    name = spec.context.summarizer
    if name is None:
        return []
    if name == spec.name:
        return [f"{where}: context summarizer must be another agent, not the agent itself"]
    if name not in {other.name for other in specs}:
        return [f"{where}: context summarizer {name!r} is not a valid agent of this file"]
    agent, summarizer = agents.get(spec.name), agents.get(name)
    if agent is not None and summarizer is not None:
        agent.context = dataclasses.replace(agent.context, summarizer=summarizer)
    return []


def _context_policy(spec: AgentSpec) -> ContextPolicy:
    """The agent's policy without its summarizer, attached once every agent is built."""
    written = spec.context.model_dump(exclude_none=True, exclude={"summarizer"})
    if spec.context.summarizer is not None and spec.context.strategy != "summarize":
        raise ValueError("a context summarizer needs strategy 'summarize'")
    return ContextPolicy(**written)


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
                "tool_policies": {t.name: t.policy.to_dict() for t in agent.tools},
                "executor": agent.executor,
                "checkpointing": agent.checkpointing,
                "limits": agent.limits.to_dict(),
                "context": agent.context.describe(),
            }
        )
    return out
