"""Agents for the cancel tests: the runtime tests' registry plus a slow stream and a patient tool.

``drawl`` streams its answer in many small chunks (``CAIRN_TEST_CHUNK_S`` apart), so a cancel
lands mid-stream; ``patient`` calls a tool that waits up to ``CAIRN_TEST_TOOL_SLEEP`` seconds
unless an immediate cancel wakes it first. Every call is logged like the base registry's.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping

from service.agent.definition import AgentDefinition
from service.agent.provider import ModelChunk, ModelProvider, ModelReply, ModelRequest, TextDelta
from service.agent.tools import ToolContext, tool
from service.agent.types import Usage
from tests.support.agents import CycleModel, _append, _position, _record_call, whole_history
from tests.support.agents import registry as base_registry

CHUNKS = 400


class DrawlModel(ModelProvider):
    """A text answer of :data:`CHUNKS` chunks; logs each call and each finished stream."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        turn, index = _position(request.messages)
        _append(
            "CAIRN_TEST_MODEL_LOG",
            {"session_id": request.session_id, "turn": turn, "index": index, "pid": os.getpid()},
        )
        pause = float(os.environ.get("CAIRN_TEST_CHUNK_S", "0.05"))
        for i in range(CHUNKS):
            await asyncio.sleep(pause)
            yield TextDelta(f"w{i} ")
        text = " ".join(f"w{i}" for i in range(CHUNKS))
        _append("CAIRN_TEST_MODEL_LOG", {"session_id": request.session_id, "complete": True})
        yield ModelReply(
            message={"role": "assistant", "content": [{"text": text}]},
            stop_reason="end_turn",
            usage=Usage(10, 5),
        )


@tool
async def wait_for_cancel(step: int, context: ToolContext) -> str:
    """Wait ``CAIRN_TEST_TOOL_SLEEP`` seconds, or less when an immediate cancel arrives.

    Args:
        step: Which cycle asked.
    """
    _record_call("wait_for_cancel", step, context)
    seconds = float(os.environ.get("CAIRN_TEST_TOOL_SLEEP", "30"))
    try:
        await asyncio.wait_for(context.cancel.wait(), timeout=seconds)
        outcome = "cancelled"
    except TimeoutError:
        outcome = "waited"
    _append(
        "CAIRN_TEST_TOOL_LOG",
        {"tool": "wait_for_cancel", "session_id": context.session_id, "outcome": outcome},
    )
    return outcome


def registry() -> Mapping[str, AgentDefinition]:
    return whole_history(
        {
            **base_registry(),
            "drawl": AgentDefinition(name="drawl", model=DrawlModel()),
            "patient": AgentDefinition(
                name="patient", model=CycleModel(1, "wait_for_cancel"), tools=[wait_for_cancel]
            ),
        }
    )
