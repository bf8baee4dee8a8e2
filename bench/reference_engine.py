"""Times the reference SDK on the benchmark scenario; runs inside the scratch virtualenv only.

Prints one JSON object on stdout: invocations per second per repetition for ``memory`` (one Agent
kept in memory for the whole turn) and ``restore`` (a fresh Agent restored from a
FileSessionManager before every invocation). Every invocation is checked against the scenario.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import uuid
from importlib.metadata import version
from typing import Any

import scenario
from reference_model import ScriptedReferenceModel
from strands import Agent, tool
from strands.session.file_session_manager import FileSessionManager
from strands.tools.executors import SequentialToolExecutor


@tool(name=scenario.TOOL_NAME, description=scenario.TOOL_DESCRIPTION)
def lookup_weather(city: str) -> str:
    """Look up the current weather of a city.

    Args:
        city: Name of the city.
    """
    return scenario.weather(city)


@tool(name=scenario.TOOL_NAME, description=scenario.TOOL_DESCRIPTION)
async def lookup_weather_async(city: str) -> str:
    """Look up the current weather of a city.

    Args:
        city: Name of the city.
    """
    return scenario.weather(city)


TOOLS = {"sync": lookup_weather, "async": lookup_weather_async}
"""A sync tool runs on a worker thread in both engines; an async one on the event loop."""


def make_agent(tool_kind: str, session_manager: FileSessionManager | None = None) -> Agent:
    return Agent(
        model=ScriptedReferenceModel(),
        tools=[TOOLS[tool_kind]],
        system_prompt=scenario.SYSTEM_PROMPT,
        callback_handler=None,
        checkpointing=True,
        session_manager=session_manager,
        # Ours runs batches sequentially by default; the same executor keeps the comparison even.
        tool_executor=SequentialToolExecutor(),
    )


def checked(step: int, result: Any) -> dict[str, Any] | None:
    checkpoint = result.checkpoint.to_dict() if result.checkpoint is not None else None
    scenario.check_stop(step, str(result.stop_reason), checkpoint)
    return checkpoint


async def turn_in_memory(tool_kind: str, timing: scenario.Timing) -> None:
    """One turn with the Agent kept in memory; building the Agent is not timed."""
    agent = make_agent(tool_kind)
    with timing.section(scenario.INVOCATIONS_PER_TURN):
        checkpoint = checked(0, await agent.invoke_async(scenario.PROMPT))
        for step in range(1, scenario.INVOCATIONS_PER_TURN):
            assert checkpoint is not None
            checkpoint = checked(step, await agent.invoke_async(scenario.resume_input(checkpoint)))


async def turn_restoring(tool_kind: str, storage_dir: str, timing: scenario.Timing) -> None:
    """One turn where every invocation restores a fresh Agent from the session files (timed)."""
    session_id = uuid.uuid4().hex
    with timing.section(scenario.INVOCATIONS_PER_TURN):
        checkpoint: dict[str, Any] | None = None
        for step in range(scenario.INVOCATIONS_PER_TURN):
            manager = FileSessionManager(session_id=session_id, storage_dir=storage_dir)
            agent = make_agent(tool_kind, manager)
            prompt: Any = scenario.PROMPT if step == 0 else scenario.resume_input(checkpoint or {})
            checkpoint = checked(step, await agent.invoke_async(prompt))


async def measure(mode: str, turns: int, storage_dir: str, tool_kind: str) -> dict[str, float]:
    timing = scenario.Timing()
    for _ in range(turns):
        if mode == "memory":
            await turn_in_memory(tool_kind, timing)
        else:
            await turn_restoring(tool_kind, storage_dir, timing)
    return timing.rates()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in args.modes}
    with tempfile.TemporaryDirectory(prefix="bench-ref-sessions-") as storage_dir:
        for mode in args.modes:
            await measure(mode, args.warmup_turns, storage_dir, args.tool)
        # Modes alternate within each repetition so background load hits them alike.
        for _ in range(args.repeats):
            for mode in args.modes:
                results[mode].append(await measure(mode, args.turns, storage_dir, args.tool))
    return {
        "engine": "strands-agents",
        "version": version("strands-agents"),
        "python": sys.version.split()[0],
        "turns_per_repeat": args.turns,
        "invocations_per_turn": scenario.INVOCATIONS_PER_TURN,
        "tool": args.tool,
        "invocations_per_s": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup-turns", type=int, default=5)
    parser.add_argument("--modes", nargs="+", default=["memory", "restore"])
    parser.add_argument("--tool", choices=sorted(TOOLS), default="sync")
    args = parser.parse_args()
    # The SDK's warnings would go to stderr per invocation and be timed; keep only errors.
    logging.basicConfig(level=logging.ERROR)
    print(json.dumps(asyncio.run(main_async(args))))


if __name__ == "__main__":
    main()
