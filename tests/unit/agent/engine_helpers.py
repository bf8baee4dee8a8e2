"""Shared helpers of the engine tests: tools, agents, running an invocation, history checks."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.agent.cancel import CancelSignal
from service.agent.definition import AgentDefinition
from service.agent.events import Event, Stopped
from service.agent.hooks import (
    AfterToolCallEvent,
    AfterToolsEvent,
    BeforeToolCallEvent,
    BeforeToolsEvent,
    HookProvider,
    HookRegistry,
    MessageAddedEvent,
)
from service.agent.loop import Invocation, run_invocation
from service.agent.messages import result_keys, result_order
from service.agent.results import tool_name_error
from service.agent.state import SessionState
from service.agent.tools import ToolContext, tool
from service.agent.types import AgentResult, Limits
from service.providers.scripted import ReplySpec, ScriptedModel, ToolCall
from service.sessions.codec import decode_state, encode_state


@tool(inline=True)
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


@tool(inline=True)
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@tool(inline=True)
def approve(action: str, context: ToolContext) -> str:
    """Ask a human before doing ``action``."""
    answer = context.interrupt("approval", reason={"action": action})
    return f"{action}:{answer}"


@tool
async def slow(seconds: float, context: ToolContext) -> str:
    """Sleep cooperatively, stopping early on cancel."""
    try:
        await asyncio.wait_for(context.cancel.wait(), seconds)
    except TimeoutError:
        return "slept"
    return "stopped early"


TOOLS = [add, echo, approve, slow]


def make_agent(
    script: Sequence[ReplySpec],
    *,
    checkpointing: bool = True,
    executor: str = "sequential",
    hooks: Sequence[HookProvider] = (),
    limits: Limits | None = None,
    tools: Sequence[Any] = TOOLS,
    mode: str = "conversation",
) -> AgentDefinition:
    model = ScriptedModel(script, mode=mode, record=True)  # type: ignore[arg-type]
    return AgentDefinition(
        name="tester",
        model=model,
        system_prompt="You test.",
        tools=list(tools),
        executor=executor,  # type: ignore[arg-type]
        hooks=list(hooks),
        checkpointing=checkpointing,
        limits=limits or Limits(),
    )


def model_of(agent: AgentDefinition) -> ScriptedModel:
    assert isinstance(agent.model, ScriptedModel)
    return agent.model


def call(name: str, tool_use_id: str | None = None, **input: Any) -> ToolCall:
    return ToolCall(name, input, tool_use_id)


@dataclass
class Outcome:
    events: list[Event]
    result: AgentResult
    state: SessionState

    @property
    def stop(self) -> str:
        return self.result.stop_reason

    @property
    def checkpoint(self) -> dict[str, Any] | None:
        return self.result.checkpoint.to_dict() if self.result.checkpoint else None

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


_counter = iter(range(10**9))


async def invoke(
    agent: AgentDefinition,
    state: SessionState,
    input: Any,
    *,
    cancel: CancelSignal | None = None,
    command_id: str | None = None,
    checkpointing: bool | None = None,
    limits: Limits | None = None,
    invocation_state: dict[str, Any] | None = None,
    result_max_bytes: int | None = None,
) -> Outcome:
    invocation = Invocation(
        command_id or f"cmd-{next(_counter)}",
        input,
        checkpointing=checkpointing,
        limits=limits,
        invocation_state=invocation_state,
        result_max_bytes=result_max_bytes,
    )
    events = [e async for e in run_invocation(agent, state, invocation, cancel=cancel)]
    last = events[-1]
    assert isinstance(last, Stopped)
    assert sum(isinstance(e, Stopped) for e in events) == 1
    return Outcome(events, last.result, last.state)


def resume(outcome_or_checkpoint: Outcome | dict[str, Any]) -> dict[str, Any]:
    checkpoint = (
        outcome_or_checkpoint.checkpoint
        if isinstance(outcome_or_checkpoint, Outcome)
        else outcome_or_checkpoint
    )
    assert checkpoint is not None
    return {"checkpointResume": {"checkpoint": checkpoint}}


class ToolHookLog(HookProvider):
    """Records the tool hooks' events with the fields the reference's events have, in order:
    ``("before_tools", ids)``, ``("before_call", toolUseId, name)``, ``("after_call", {...})``,
    ``("after_tools", results)``, ``("added", message)``; ``cancel`` maps a tool name to the
    ``cancel_tool`` its before-tool-call event gets."""

    def __init__(self, cancel: dict[str, bool | str] | None = None) -> None:
        self.seen: list[tuple[Any, ...]] = []
        self.cancel = cancel or {}

    def register_hooks(self, registry: HookRegistry) -> None:
        registry.add_callback(BeforeToolsEvent, self.before_tools)
        registry.add_callback(BeforeToolCallEvent, self.before_call)
        registry.add_callback(AfterToolCallEvent, self.after_call)
        registry.add_callback(AfterToolsEvent, self.after_tools)
        registry.add_callback(MessageAddedEvent, lambda e: self.seen.append(("added", e.message)))

    def before_tools(self, event: BeforeToolsEvent) -> None:
        self.seen.append(("before_tools", [u["toolUseId"] for u in event.tool_uses]))

    def before_call(self, event: BeforeToolCallEvent) -> None:
        self.seen.append(("before_call", event.tool_use["toolUseId"], event.tool_use.get("name")))
        if event.tool_use.get("name") in self.cancel:
            event.cancel_tool = self.cancel[event.tool_use["name"]]

    def after_call(self, event: AfterToolCallEvent) -> None:
        selected = event.selected_tool
        fields = {
            "tool_use": event.tool_use,
            "selected_tool": None if selected is None else selected.name,
            "result": event.result["toolResult"],
            "exception": event.exception,
            "cancel_message": event.cancel_message,
            "duration": event.duration,
        }
        self.seen.append(("after_call", fields))

    def after_tools(self, event: AfterToolsEvent) -> None:
        self.seen.append(("after_tools", [b["toolResult"] for b in event.results]))

    def take(self) -> list[tuple[Any, ...]]:
        """What was recorded since the last take."""
        seen, self.seen = self.seen, []
        return seen


def answers(*pairs: tuple[str, Any]) -> list[dict[str, Any]]:
    return [{"interruptResponse": {"interruptId": i, "response": r}} for i, r in pairs]


def roundtrip(state: SessionState) -> SessionState:
    return decode_state(encode_state(state))


def texts(message: dict[str, Any]) -> list[str]:
    return [b["text"] for b in message["content"] if "text" in b]


def results_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [b["toolResult"] for b in message["content"] if "toolResult" in b]


def _results_by_key(uses: list[dict[str, Any]], message: dict[str, Any]) -> dict[str, Any]:
    """The result blocks of ``message`` under the result keys of ``uses`` (an id given more than
    once: a name error goes to a call with an invalid name, the others in turn)."""
    by_id: dict[str, list[dict[str, Any]]] = {}
    for block in message["content"]:
        if "toolResult" in block:
            by_id.setdefault(block["toolResult"]["toolUseId"], []).append(block)
    keyed = list(zip(uses, result_keys(uses), strict=True))
    blocks: dict[str, Any] = {}
    for invalid in (True, False):
        for use, key in keyed:
            if (tool_name_error(use) is not None) != invalid:
                continue
            left = by_id.get(use["toolUseId"], [])
            named = [b for b in left if "tool_name=<" in str(b["toolResult"]["content"])]
            pick = (named or left)[:1] if invalid else left[:1]
            if pick:
                blocks[key] = pick[0]
                left.remove(pick[0])
    return blocks


def check_history(state: SessionState, resumed_ids: frozenset[str] = frozenset()) -> None:
    """Roles alternate; each toolUse has exactly one toolResult, in the next message, in order
    (:func:`~service.agent.messages.result_order`: name errors first, then toolUse order).

    The assistant message of a pending batch (last in history) is allowed to lack results, and
    so is a repeat of a toolUseId of ``resumed_ids`` that has a result from another call (a
    batch resumed from an interrupt runs no call of an id that had a result at the pause).
    """
    messages = state.messages
    for before, after in itertools.pairwise(messages):
        assert before["role"] != after["role"], f"two {before['role']} messages in a row"
    seen_results: set[str] = set()
    for index, message in enumerate(messages):
        uses = [b["toolUse"]["toolUseId"] for b in message["content"] if "toolUse" in b]
        results = [r["toolUseId"] for r in results_of(message)]
        assert not (uses and message["role"] != "assistant"), "toolUse outside an assistant message"
        assert not (results and message["role"] != "user"), "toolResult outside a user message"
        assert not set(results) & seen_results, "a toolUse got two results"
        seen_results.update(results)
        if not uses:
            continue
        if index == len(messages) - 1:
            assert state.pending is not None, "trailing toolUse without a pending batch"
            assert state.pending.assistant_message == message
            continue
        tool_use_list = [b["toolUse"] for b in message["content"] if "toolUse" in b]
        blocks = _results_by_key(tool_use_list, messages[index + 1])
        following = [r["toolUseId"] for r in results_of(messages[index + 1])]
        ordered = [
            u["toolUseId"]
            for u, key in result_order(tool_use_list, blocks)
            if key in blocks or u["toolUseId"] not in resumed_ids
        ]
        # A toolUse the name check's answer to another of its id shadows gets none.
        assert sorted(following) == sorted(ordered), (
            f"results {following} do not match toolUses {uses}"
        )
        assert following == ordered, f"results {following} are not in the order {ordered}"
    if state.pending is not None:
        assert messages and messages[-1] == state.pending.assistant_message


SCENARIOS = {
    "two_cycles": lambda: make_agent(
        [call("echo", "e1", text="a"), call("add", "a1", a=2, b=3), "done"]
    ),
    "approval": lambda: make_agent([call("approve", "ap", action="ship"), "shipped"]),
    "approval_off": lambda: make_agent(
        [call("approve", "ap", action="ship"), "shipped"], checkpointing=False
    ),
}
