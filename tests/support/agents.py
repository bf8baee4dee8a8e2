"""The agent registry the runtime tests run inside real service processes.

Replies are chosen from the conversation itself (how many assistant messages follow the last
user prompt), so any instance, and a replay after a crash, gives the same reply. Every model
call and every tool call is appended to a JSON-lines file named by the environment, so a test
can count them across processes; tool lines carry the idempotency key.

Knobs (environment of the service process, read here because this is test support):
``CAIRN_TEST_MODEL_LATENCY`` = ``"<reply index>:<seconds>"``, ``CAIRN_TEST_TOOL_SLEEP`` = seconds.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from service.agent.context import SUMMARY_PROMPT, ContextPolicy
from service.agent.definition import AgentDefinition
from service.agent.provider import ModelChunk, ModelProvider, ModelReply, ModelRequest, TextDelta
from service.agent.tools import ToolContext, tool
from service.agent.types import Usage


def _append(env_name: str, entry: dict[str, Any]) -> None:
    path = os.environ.get(env_name)
    if not path:
        return
    line = json.dumps(entry) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _position(messages: list[dict[str, Any]]) -> tuple[int, int]:
    """(turn number, reply index within the turn) from the conversation. Plain loops: the
    benchmarks run this model at thousands of steps a second, in the service's process."""
    turn = 0
    index = 0
    counting = True
    for message in reversed(messages):
        texts = _has_text(message)
        if message.get("role") == "user" and texts:
            turn += 1
        if counting:
            if message.get("role") == "assistant":
                index += 1
            elif texts:
                counting = False
    return turn, index


def _has_text(message: dict[str, Any]) -> bool:
    # A loop, not any() over a generator: half the cost, on the benchmarks' hot path.
    for block in message.get("content") or ():  # noqa: SIM110
        if "text" in block:
            return True
    return False


def tool_reply(uses: list[dict[str, Any]]) -> ModelReply:
    """The assistant's reply asking for the tool uses ``uses`` (``toolUse`` bodies)."""
    message = {"role": "assistant", "content": [{"toolUse": use} for use in uses]}
    return ModelReply(message=message, stop_reason="tool_use", usage=Usage(10, 5))


def answer(text: str) -> list[ModelChunk]:
    """A text answer as a model streams it: the text, then the reply that ends the turn."""
    return [
        TextDelta(text),
        ModelReply(
            message={"role": "assistant", "content": [{"text": text}]},
            stop_reason="end_turn",
            usage=Usage(10, 5),
        ),
    ]


class CycleModel(ModelProvider):
    """``cycles`` tool calls of ``tool_name`` per turn, then a text answer."""

    def __init__(self, cycles: int, tool_name: str = "record") -> None:
        self.cycles = cycles
        self.tool_name = tool_name

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        turn, index = _position(request.messages)
        _append(
            "CAIRN_TEST_MODEL_LOG",
            {"session_id": request.session_id, "turn": turn, "index": index, "pid": os.getpid()},
        )
        latency = os.environ.get("CAIRN_TEST_MODEL_LATENCY")
        if latency:
            at, seconds = latency.split(":")
            if int(at) == index:
                await asyncio.sleep(float(seconds))
        for chunk in _cycle(self, index, f"t{turn}c{index}", f"done turn {turn}"):
            yield chunk


class BenchModel(ModelProvider):
    """:class:`CycleModel`'s replies for the benchmarks, at a cost that does not grow with the
    conversation (the benchmarks send the whole history, hundreds of messages, thousands of
    times a second): the reply index is counted back to the turn's prompt, and the prompt's
    place in the conversation names the turn. It logs nothing and has no latency knob."""

    def __init__(self, cycles: int, tool_name: str) -> None:
        self.cycles = cycles
        self.tool_name = tool_name

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        messages = request.messages
        index = 0
        prompt = len(messages)
        while prompt > 0:
            prompt -= 1
            message = messages[prompt]
            if message.get("role") == "assistant":
                index += 1
            elif _has_text(message):
                break
        for chunk in _cycle(self, index, f"p{prompt}c{index}", f"done, prompt at {prompt}"):
            yield chunk


def _cycle(model: CycleModel | BenchModel, index: int, use_id: str, text: str) -> list[ModelChunk]:
    """Reply ``index`` of a turn: a call of the model's tool while cycles are left, then
    ``text``."""
    if index < model.cycles:
        return [
            tool_reply([{"toolUseId": use_id, "name": model.tool_name, "input": {"step": index}}])
        ]
    return answer(text)


class WindowModel(ModelProvider):
    """``cycles`` tool calls of ``record``, then a text answer, decided from the request alone
    (the last tool result names the step), so a windowed or summarized view changes nothing;
    summaries when asked for one. Every request is logged whole, and kept in ``seen``."""

    def __init__(self, cycles: int) -> None:
        self.cycles = cycles
        self.seen: list[list[dict[str, Any]]] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        self.seen.append(request.messages)
        summarizing = request.system_prompt == SUMMARY_PROMPT
        _append(
            "CAIRN_TEST_MODEL_LOG",
            {
                "session_id": request.session_id,
                "pid": os.getpid(),
                "summary": summarizing,
                "messages": request.messages,
            },
        )
        done = [
            b["toolResult"]["toolUseId"]
            for m in request.messages
            for b in m.get("content") or []
            if "toolResult" in b
        ]
        if summarizing:
            text = "Summary: steps " + ", ".join(done) + " recorded."
        else:
            step = int(done[-1][1:]) + 1 if done else 0
            if step < self.cycles:
                yield tool_reply(
                    [{"toolUseId": f"w{step}", "name": "record", "input": {"step": step}}]
                )
                return
            text = "all steps recorded"
        yield ModelReply(
            message={"role": "assistant", "content": [{"text": text}]},
            stop_reason="end_turn",
            usage=Usage(10, 5),
        )


def windowed() -> AgentDefinition:
    """Six tool cycles under a small summarizing window: two summaries per turn."""
    return AgentDefinition(
        name="windowed",
        model=WindowModel(6),
        tools=[record],
        checkpointing=True,
        context=ContextPolicy("summarize", max_messages=5, keep_recent=2),
    )


def _record_call(name: str, step: int, context: ToolContext) -> None:
    _append(
        "CAIRN_TEST_TOOL_LOG",
        {
            "tool": name,
            "step": step,
            "session_id": context.session_id,
            "tool_use_id": context.tool_use_id,
            "idempotency_key": context.idempotency_key,
            "pid": os.getpid(),
            "time": time.time(),
        },
    )


@tool
def record(step: int, context: ToolContext) -> str:
    """Record this call and return at once.

    Args:
        step: Which cycle asked.
    """
    _record_call("record", step, context)
    return f"recorded {step}"


def bulky_text(idempotency_key: str, size: int) -> str:
    """``size`` characters that do not compress, the same for the same key (so a rerun after a
    crash returns what the first run did)."""
    blocks = (
        hashlib.sha256(f"{idempotency_key}/{i}".encode()).hexdigest() for i in range(size // 64 + 1)
    )
    return "".join(blocks)[:size]


@tool
def bulky(step: int, context: ToolContext) -> str:
    """Record this call and return ``CAIRN_TEST_RESULT_BYTES`` characters of incompressible text.

    Args:
        step: Which cycle asked.
    """
    _record_call("bulky", step, context)
    size = int(os.environ.get("CAIRN_TEST_RESULT_BYTES", "200000"))
    return bulky_text(context.idempotency_key, size)


@tool
async def tick(step: int) -> str:
    """Return at once, on the event loop (a zero-latency tool, for the benchmark).

    Args:
        step: Which cycle asked.
    """
    return f"tick {step}"


@tool(name="tick", effect="once")
async def tick_once(step: int) -> str:
    """Return at once, on the event loop; recorded in the ledger of once tools first (for the
    benchmark of what that costs).

    Args:
        step: Which cycle asked.
    """
    return f"tick {step}"


@tool
async def slow(step: int, context: ToolContext) -> str:
    """Record this call, then take ``CAIRN_TEST_TOOL_SLEEP`` seconds.

    Args:
        step: Which cycle asked.
    """
    _record_call("slow", step, context)
    await asyncio.sleep(float(os.environ.get("CAIRN_TEST_TOOL_SLEEP", "0")))
    return f"slow {step}"


@tool
def approve(step: int, context: ToolContext) -> str:
    """Ask a human before going on.

    Args:
        step: Which cycle asked.
    """
    _record_call("approve", step, context)
    answer = context.interrupt("approval", reason={"step": step})
    return f"approved: {answer}"


def whole_history(agents: Mapping[str, AgentDefinition]) -> dict[str, AgentDefinition]:
    """The agents with the whole history in view: their models count their position (turn,
    reply index) in the conversation they are sent, which a window would cut."""
    for agent in agents.values():
        if agent.name != "windowed":
            agent.context = ContextPolicy("none")
    return dict(agents)


def registry() -> Mapping[str, AgentDefinition]:
    return whole_history(_agents())


def _agents() -> Mapping[str, AgentDefinition]:
    return {
        "simple": AgentDefinition(name="simple", model=CycleModel(0)),
        "cycles": AgentDefinition(name="cycles", model=CycleModel(2), tools=[record]),
        "bench": AgentDefinition(
            name="bench", model=BenchModel(3, "tick"), tools=[tick], checkpointing=True
        ),
        "bench-once": AgentDefinition(
            name="bench-once", model=BenchModel(3, "tick"), tools=[tick_once], checkpointing=True
        ),
        "long": AgentDefinition(name="long", model=CycleModel(6), tools=[record]),
        "bulky": AgentDefinition(name="bulky", model=CycleModel(4, "bulky"), tools=[bulky]),
        "hoard": AgentDefinition(
            name="hoard",
            model=CycleModel(int(os.environ.get("CAIRN_TEST_HOARD_CYCLES", "25")), "bulky"),
            tools=[bulky],
        ),
        "slowtools": AgentDefinition(name="slowtools", model=CycleModel(2, "slow"), tools=[slow]),
        "approval": AgentDefinition(
            name="approval", model=CycleModel(1, "approve"), tools=[approve]
        ),
        "windowed": windowed(),
    }
