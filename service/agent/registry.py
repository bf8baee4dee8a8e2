"""Find a deployment's agent registry from an import path ``package.module:attribute``.

The attribute is a mapping of agent name to :class:`AgentDefinition`, or a zero-argument
callable returning one; every value is checked to be a definition.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from service.agent.definition import AgentDefinition


def load_agent_registry(import_path: str) -> Mapping[str, AgentDefinition]:
    module_name, sep, attribute = import_path.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"agent registry path {import_path!r} is not 'package.module:attribute'")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    if callable(target) and not isinstance(target, Mapping):
        target = target()
    if not isinstance(target, Mapping):
        raise TypeError(f"agent registry {import_path!r} is not a mapping")
    for key, value in target.items():
        if not isinstance(value, AgentDefinition):
            raise TypeError(f"agent registry {import_path!r}: {key!r} is not an AgentDefinition")
    return target
