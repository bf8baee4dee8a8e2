"""The demo agent registry, the service's default (``CAIRN_AGENTS=service.demo:agents``).

Runs with no credentials: a scripted model in conversation mode (one instance serves every
session, replays are identical) and deterministic tools. Each call builds fresh definitions.
"""

from __future__ import annotations

from service.agent.definition import AgentDefinition
from service.agent.types import Limits
from service.demo.script import demo_reply
from service.demo.tools import calculator, request_approval, slow_job, weather
from service.providers.scripted import ScriptedModel

SYSTEM_PROMPT = (
    "You are Cairn's demo assistant. Use the calculator for arithmetic, the weather tool for "
    "forecasts, ask for approval before sharing anything, and run slow jobs when asked."
)


def demo_agent(name: str = "demo", *, checkpointing: bool = False) -> AgentDefinition:
    return AgentDefinition(
        name=name,
        model=ScriptedModel(demo_reply, mode="conversation"),
        system_prompt=SYSTEM_PROMPT,
        tools=(calculator, weather, request_approval, slow_job),
        # The calculation and the forecast of one batch run side by side.
        executor="concurrent",
        checkpointing=checkpointing,
        limits=Limits(max_cycles=8),
    )


def agents() -> dict[str, AgentDefinition]:
    """The registry: ``demo`` (checkpointing when asked) and ``demo-checkpointed`` (always)."""
    return {
        "demo": demo_agent(),
        "demo-checkpointed": demo_agent("demo-checkpointed", checkpointing=True),
    }
