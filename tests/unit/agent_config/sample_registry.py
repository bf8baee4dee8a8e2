"""A Python agent registry the loader tests import by path."""

from __future__ import annotations

from service.agent.definition import AgentDefinition
from service.providers.scripted import ScriptedModel


def agents() -> dict[str, AgentDefinition]:
    return {"echo": AgentDefinition(name="echo", model=ScriptedModel(["hi"]))}
