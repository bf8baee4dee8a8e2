"""An agent's tool entries resolved to tools: an import path, or a table of a path and options.

Guarantee: the options written override the imported tool's own policy field by field, on a
copy (the imported tool is left as it is), for every tool the path names; every problem of an
entry is raised at once, each naming the tool path.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import ValidationError

from service.agent.tools import Tool, ToolPolicy
from service.agent_config.errors import AgentConfigError, validation_problems
from service.agent_config.imports import resolve_tools
from service.agent_config.schema import ToolEntry


def build_tools(entry: str | dict[str, Any], index: int) -> list[Tool]:
    """The tools of ``entry`` (the agent's ``tools.<index>``), their options applied."""
    if isinstance(entry, str):
        return resolve_tools(entry)
    path = entry.get("path")
    label = f"tool {path!r}" if isinstance(path, str) else f"tools.{index}"
    problems: list[str] = []
    options: dict[str, Any] | None = None
    try:
        options = ToolEntry.model_validate(entry).policy_options()
    except ValidationError as exc:
        problems.extend(f"{label}: {problem}" for problem in validation_problems(exc))
    tools: list[Tool] = []
    if isinstance(path, str):
        try:
            tools = resolve_tools(path)
        except AgentConfigError as exc:
            problems.extend(exc.problems)
    if options:
        try:
            # The options by themselves, so that they are checked even when the path
            # names no tool, and a table giving both once and retries is refused once.
            ToolPolicy(**options)
        except ValueError as exc:
            problems.append(f"{label}: {exc}")
        else:
            tools, refused = _with_options(tools, options, label)
            problems.extend(refused)
    if problems:
        raise AgentConfigError(*problems)
    return tools


def _with_options(
    tools: list[Tool], options: dict[str, Any], label: str
) -> tuple[list[Tool], list[str]]:
    """Each tool under its own policy with ``options`` written over it; the refusals."""
    out: list[Tool] = []
    refused: list[str] = []
    for each in tools:
        try:
            # The merged policy is checked as a whole: a tool declared ``once`` refuses the
            # file's retries.
            out.append(each.with_policy(dataclasses.replace(each.policy, **options)))
        except ValueError as exc:
            who = label if len(tools) == 1 else f"{label} ({each.name})"
            refused.append(f"{who}: {exc}")
    return out, refused
