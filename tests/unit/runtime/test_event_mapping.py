"""Engine events become progress events the wire accepts, including an interrupted tool's finish."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from service.agent.definition import AgentDefinition
from service.agent.events import Boundary, ModelTextDelta, Stopped, ToolFinished
from service.agent.invocation import Invocation
from service.agent.loop import run_invocation
from service.agent.state import SessionState
from service.agent.tools import ToolContext, tool
from service.providers.scripted import ScriptedModel, ToolCall, text, tool_calls
from service.runtime.invoker import describe_event
from service.runtime.records import event_record
from service.wire.codec import decode_event
from service.wire.events import ToolFinishedEvent

TOPIC = "cairn.events"


def _published(event: object, seq: int = 1) -> Any:
    kind, data = describe_event(event)
    record = event_record(TOPIC, "s", "c", seq, kind, data)
    assert record.value is not None
    return decode_event(record.value)


@pytest.mark.parametrize("status", ["success", "error", "interrupted"])
def test_a_tool_finish_is_published_with_its_status(status: str) -> None:
    event = _published(ToolFinished("tooluse_1", "approve", status), seq=3)
    assert isinstance(event, ToolFinishedEvent)
    assert (event.tool_use_id, event.name, event.status, event.seq) == (
        "tooluse_1",
        "approve",
        status,
        3,
    )


def test_a_tool_status_outside_the_contract_is_refused() -> None:
    with pytest.raises(ValidationError, match="status"):
        _published(ToolFinished("tooluse_1", "approve", "exploded"))


@tool
def approve(step: int, context: ToolContext) -> str:
    """Ask a person before going on.

    Args:
        step: Which step needs the approval.
    """
    return f"approved: {context.interrupt('approval', reason={'step': step})}"


async def test_every_event_of_an_interrupting_turn_is_publishable() -> None:
    """What the engine yields for a tool that interrupts, then runs again once answered."""
    model = ScriptedModel(
        [tool_calls(ToolCall("approve", {"step": 1}, "tooluse_approve")), text("done")],
        mode="conversation",
    )
    agent = AgentDefinition(name="approval", model=model, tools=[approve])
    state = SessionState(session_id="s")
    published: list[Any] = []
    value: Any = "go"
    for command_id in ("c1", "c2"):
        async for event in run_invocation(agent, state, Invocation(command_id, value)):
            if isinstance(event, Stopped):
                state = event.state
                if event.result.interrupts:
                    interrupt = event.result.interrupts[0]
                    answer = {"interruptId": interrupt.id, "response": "yes"}
                    value = [{"interruptResponse": answer}]
            elif not isinstance(event, ModelTextDelta | Boundary):
                published.append(_published(event, seq=len(published) + 1))
    finished = [e.status for e in published if e.type == "tool_finished"]
    assert finished == ["interrupted", "success"]
    kinds = [e.type for e in published]
    assert kinds.index("tool_finished") < kinds.index("interrupt_raised")
