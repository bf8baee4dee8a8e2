"""Agents for the tool-effect fault tests: the runtime tests' registry plus a batch of a ``once``
tool and an idempotent one.

``charge`` (effect once) and ``fetch`` (idempotent) are asked for together, in one batch, in
the first cycle of every turn. Each logs its call like the base registry's tools, then waits as
long as a gate file named after it exists in ``CAIRN_TEST_GATE_DIR``, so a test holds a tool
inside its run for exactly as long as it needs, and kills the process there.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from service.agent.definition import AgentDefinition
from service.agent.provider import ModelChunk, ModelProvider, ModelRequest
from service.agent.tools import ToolContext, tool
from tests.support.agents import _append, _position, _record_call, answer, tool_reply, whole_history
from tests.support.agents import registry as base_registry


async def _gate(name: str) -> None:
    folder = os.environ.get("CAIRN_TEST_GATE_DIR")
    if not folder:
        return
    gate = Path(folder) / name
    while gate.exists():
        await asyncio.sleep(0.05)


@tool(effect="once")
async def charge(step: int, context: ToolContext) -> str:
    """Charge the customer (must not happen twice).

    Args:
        step: Which cycle asked.
    """
    _record_call("charge", step, context)
    await _gate("charge")
    return f"charged {step}"


@tool
async def fetch(step: int, context: ToolContext) -> str:
    """Fetch a document (safe to repeat).

    Args:
        step: Which cycle asked.
    """
    _record_call("fetch", step, context)
    await _gate("fetch")
    return f"fetched {step}"


class BatchModel(ModelProvider):
    """One batch of ``charge`` and ``fetch`` per turn, then a text answer."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        turn, index = _position(request.messages)
        _append(
            "CAIRN_TEST_MODEL_LOG",
            {"session_id": request.session_id, "turn": turn, "index": index, "pid": os.getpid()},
        )
        if index == 0:
            yield tool_reply(
                [
                    {"toolUseId": f"t{turn}-{name}", "name": name, "input": {"step": 0}}
                    for name in ("charge", "fetch")
                ]
            )
            return
        for chunk in answer(f"done turn {turn}"):
            yield chunk


def registry() -> Mapping[str, AgentDefinition]:
    agents = dict(base_registry())
    for executor in ("sequential", "concurrent"):
        name = f"ledger-{executor}"
        agents[name] = AgentDefinition(
            name=name,
            model=BatchModel(),
            tools=[charge, fetch],
            executor=executor,  # type: ignore[arg-type]
        )
    return whole_history(agents)
