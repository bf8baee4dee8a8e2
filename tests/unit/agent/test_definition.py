"""Agent definitions and the registry found by import path."""

from __future__ import annotations

import sys
import types

import pytest
from engine_helpers import add, echo, make_agent

from service.agent.definition import AgentDefinition
from service.agent.registry import load_agent_registry
from service.providers.scripted import ScriptedModel


def test_tool_map_and_specs_are_prepared() -> None:
    agent = make_agent(["x"], tools=[add, echo])
    assert set(agent.tool_map) == {"add", "echo"}
    assert [s.name for s in agent.tool_specs] == ["add", "echo"]


def test_duplicate_tool_names_and_bad_executor_are_refused() -> None:
    with pytest.raises(ValueError, match="two tools"):
        AgentDefinition("a", ScriptedModel([]), tools=[add, add])
    with pytest.raises(ValueError, match="executor"):
        AgentDefinition("a", ScriptedModel([]), executor="parallel")  # type: ignore[arg-type]


def test_registry_from_mapping_or_factory() -> None:
    module = types.ModuleType("cairn_test_registry_mod")
    agent = AgentDefinition("demo", ScriptedModel(["hi"]))
    module.AGENTS = {"demo": agent}  # type: ignore[attr-defined]
    module.build = lambda: {"demo": agent}  # type: ignore[attr-defined]
    module.BAD = {"demo": object()}  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        assert load_agent_registry("cairn_test_registry_mod:AGENTS") == {"demo": agent}
        assert load_agent_registry("cairn_test_registry_mod:build") == {"demo": agent}
        with pytest.raises(TypeError):
            load_agent_registry("cairn_test_registry_mod:BAD")
        with pytest.raises(ValueError):
            load_agent_registry("cairn_test_registry_mod")
    finally:
        del sys.modules[module.__name__]
