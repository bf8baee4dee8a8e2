"""Resolution of ``package.module:attribute`` import paths to tools and hooks.

A tool path may also name a module (``package.module``, no attribute): a module of Strands
tools. Strands objects are recognised only when the ``strands`` package is already loaded (by
the module the path names), so nothing of Strands is imported otherwise.

Guarantee: every failure (missing module, missing attribute, wrong kind of object, an exception
raised while importing) becomes an :class:`AgentConfigError` naming the path.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from service.agent.hooks import HookProvider
from service.agent.tools import Tool, tool
from service.agent_config.errors import AgentConfigError


def resolve(path: str, what: str) -> Any:
    module_name, _, attribute = path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise AgentConfigError(f"{what} {path!r} cannot be imported: {exc}") from exc
    except Exception as exc:
        raise AgentConfigError(
            f"{what} {path!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    for part in attribute.split(".") if attribute else ():
        try:
            target = getattr(target, part)
        except AttributeError:
            raise AgentConfigError(
                f"{what} {path!r}: {module_name!r} has no attribute {attribute!r}"
            ) from None
    return target


def resolve_tools(path: str) -> list[Tool]:
    """A Tool, a plain function (made a tool), or a sequence of tools (a tool set)."""
    target = resolve(path, "tool")
    found = _strands_tools(target, path)
    if found is not None:
        return found
    if isinstance(target, Tool):
        return [target]
    if isinstance(target, Sequence) and not isinstance(target, str | bytes):
        if all(isinstance(item, Tool) for item in target):
            return list(target)
        raise AgentConfigError(f"tool {path!r} is a sequence holding something other than tools")
    if callable(target) and not isinstance(target, type):
        try:
            return [tool(target)]
        except Exception as exc:
            raise AgentConfigError(
                f"tool {path!r} cannot be made a tool: {type(exc).__name__}: {exc}"
            ) from exc
    if isinstance(target, ModuleType):
        raise AgentConfigError(
            f"tool {path!r} is a module holding no Strands tools; name a tool in it with an "
            "import path 'package.module:attribute'"
        )
    raise AgentConfigError(f"tool {path!r} is a {type(target).__name__}, not a tool or function")


def _strands_tools(target: Any, path: str) -> list[Tool] | None:
    """The tools of a Strands target; None when ``target`` holds no Strands tool."""
    if "strands" not in sys.modules:
        return None
    # Imported here: only an agent naming Strands objects needs cairn[strands].
    from service.strands_adapter.tools import strands_tools

    try:
        return strands_tools(target)
    except Exception as exc:
        raise AgentConfigError(
            f"tool {path!r}: the Strands tool cannot be used: {type(exc).__name__}: {exc}"
        ) from exc


def resolve_hook(path: str) -> HookProvider:
    """A hook provider instance, or a class of one built without arguments."""
    target = resolve(path, "hook")
    if isinstance(target, type) and issubclass(target, HookProvider):
        target = target()
    if not isinstance(target, HookProvider):
        raise AgentConfigError(f"hook {path!r} is a {type(target).__name__}, not a HookProvider")
    return target
