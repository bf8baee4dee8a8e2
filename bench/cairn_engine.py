"""Times our engine on the benchmark scenario, the way the runtime drives it.

Every invocation starts from the session state as bytes (decoded), runs to its ``Stopped`` event,
and encodes the new state back to bytes: of the session, only those bytes survive between
invocations (the agent definition is shared, as in a deployment).
"""

from __future__ import annotations

from typing import Any

from bench import scenario
from service.agent.definition import AgentDefinition
from service.agent.events import Stopped
from service.agent.loop import Invocation, run_invocation
from service.agent.state import SessionState
from service.agent.tools import tool
from service.providers.scripted import ReplySpec, ScriptedModel, ToolCall
from service.sessions.codec import decode_state, encode_state


@tool
def lookup_weather(city: str) -> str:
    """Look up the current weather of a city.

    Args:
        city: Name of the city.
    """
    return scenario.weather(city)


@tool(name=scenario.TOOL_NAME)
async def lookup_weather_async(city: str) -> str:
    """Look up the current weather of a city.

    Args:
        city: Name of the city.
    """
    return scenario.weather(city)


TOOLS = {"sync": lookup_weather, "async": lookup_weather_async}
"""A sync tool runs on a worker thread in both engines; an async one on the event loop."""


def make_definition(tool_kind: str = "sync") -> AgentDefinition:
    return AgentDefinition(
        name="bench",
        model=ScriptedModel(scenario_replies(), mode="conversation"),
        system_prompt=scenario.SYSTEM_PROMPT,
        tools=[TOOLS[tool_kind]],
        checkpointing=True,
    )


def scenario_replies() -> list[ReplySpec]:
    """``scenario.REPLIES`` in the scripted provider's terms (same toolUseIds as the reference)."""
    replies: list[ReplySpec] = []
    for reply in scenario.REPLIES:
        if "tool_use" in reply:
            use = reply["tool_use"]
            replies.append(ToolCall(use["name"], use["input"], use["toolUseId"]))
        else:
            replies.append(reply["text"])
    return replies


async def run_turn(definition: AgentDefinition, session_id: str, timing: scenario.Timing) -> None:
    """One turn of five invocations from bytes to bytes, all of it timed."""
    with timing.section(scenario.INVOCATIONS_PER_TURN):
        blob = encode_state(SessionState(session_id=session_id, agent=definition.name))
        checkpoint: dict[str, Any] | None = None
        for step in range(scenario.INVOCATIONS_PER_TURN):
            state = decode_state(blob)
            prompt: Any = scenario.PROMPT if step == 0 else scenario.resume_input(checkpoint or {})
            invocation = Invocation(command_id=f"{session_id}:{step}", input=prompt)
            stopped: Stopped | None = None
            async for event in run_invocation(definition, state, invocation):
                if isinstance(event, Stopped):
                    stopped = event
            assert stopped is not None, "the engine must end every invocation with Stopped"
            result = stopped.result
            checkpoint = result.checkpoint.to_dict() if result.checkpoint is not None else None
            scenario.check_stop(step, result.stop_reason, checkpoint)
            blob = encode_state(stopped.state)


async def measure(turns: int, warmup_turns: int, tool_kind: str = "sync") -> dict[str, float]:
    """Invocations per second over ``turns`` fresh sessions, after ``warmup_turns`` untimed."""
    definition = make_definition(tool_kind)
    for turn in range(warmup_turns):
        await run_turn(definition, f"warmup-{turn}", scenario.Timing())
    timing = scenario.Timing()
    for turn in range(turns):
        await run_turn(definition, f"session-{turn}", timing)
    return timing.rates()


def profile(turns: int, tool_kind: str = "sync", limit: int = 35) -> str:
    """cProfile of ``turns`` timed turns, top functions by own time and by cumulative time."""
    import asyncio
    import cProfile
    import io
    import pstats

    definition = make_definition(tool_kind)
    asyncio.run(run_turn(definition, "warmup", scenario.Timing()))
    profiler = cProfile.Profile()

    async def turns_() -> None:
        for turn in range(turns):
            await run_turn(definition, f"profiled-{turn}", scenario.Timing())

    profiler.enable()
    asyncio.run(turns_())
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out).strip_dirs()
    stats.sort_stats("tottime").print_stats(limit)
    stats.sort_stats("cumulative").print_stats(limit)
    return out.getvalue()
