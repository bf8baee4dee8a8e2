"""A support agent on the scripted model whose sessions pause at checkpoints and an interrupt.

It produces the golden session states of ``contracts/sessions/`` and resumes them in the tests,
so a golden file is proven to load and to continue to the end of its turn.
"""

from __future__ import annotations

from typing import Any

from service.agent.definition import AgentDefinition
from service.agent.events import Stopped
from service.agent.invocation import Invocation
from service.agent.loop import run_invocation
from service.agent.state import SessionState
from service.agent.tools import ToolContext, tool
from service.agent.types import AgentResult
from service.providers.scripted import ScriptedModel, ToolCall, text, tool_calls

SESSION = "support-4711"
PROMPT = "Where is order 8812? If it is late, refund the shipping fee."
FINAL_TEXT = "Order 8812 is delayed by two days; the shipping fee was refunded."


@tool
def lookup_order(order_id: str) -> dict[str, Any]:
    """Look an order up by its id.

    Args:
        order_id: The order number.
    """
    return {"order_id": order_id, "status": "delayed", "shipping_fee": 4.99}


@tool
def issue_refund(order_id: str, amount: float, currency: str, context: ToolContext) -> str:
    """Refund an amount of an order after a human approved it.

    Args:
        order_id: The order number.
        amount: How much to refund.
        currency: ISO currency code.
    """
    answer = context.interrupt(
        "approve_refund", reason={"order_id": order_id, "amount": amount, "currency": currency}
    )
    if isinstance(answer, dict) and answer.get("approved"):
        return f"refunded {amount} {currency} on order {order_id}"
    return "refund declined"


def support_agent() -> AgentDefinition:
    model = ScriptedModel(
        [
            tool_calls(
                ToolCall("lookup_order", {"order_id": "8812"}, "tooluse_lookup_01"),
            ),
            tool_calls(
                ToolCall(
                    "issue_refund",
                    {"order_id": "8812", "amount": 4.99, "currency": "EUR"},
                    "tooluse_refund_02",
                ),
            ),
            text(FINAL_TEXT),
        ],
        mode="conversation",
    )
    return AgentDefinition(
        name="support",
        model=model,
        system_prompt="You help customers with their orders.",
        tools=[lookup_order, issue_refund],
        checkpointing=True,
    )


async def step(
    agent: AgentDefinition, state: SessionState, command_id: str, value: Any
) -> tuple[AgentResult, SessionState]:
    """Run one invocation to its end; returns the result and the new state."""
    async for event in run_invocation(agent, state, Invocation(command_id, value)):
        if isinstance(event, Stopped):
            return event.result, event.state
    raise AssertionError("the invocation ended without a Stopped event")


def continuation(result: AgentResult) -> Any:
    """The input that continues after ``result``: its checkpoint, or an approval."""
    if result.checkpoint is not None:
        return {"checkpointResume": {"checkpoint": result.checkpoint.to_dict()}}
    if result.interrupts:
        return [
            {"interruptResponse": {"interruptId": i.id, "response": {"approved": True}}}
            for i in result.interrupts
        ]
    raise AssertionError(f"nothing to continue after stop_reason {result.stop_reason!r}")


async def run_to_end(
    agent: AgentDefinition, state: SessionState, first: Any, *, max_steps: int = 10
) -> tuple[list[AgentResult], SessionState]:
    """Feed ``first``, then keep continuing until the turn ends; returns every result."""
    results: list[AgentResult] = []
    value = first
    for index in range(max_steps):
        result, state = await step(agent, state, f"cmd-{index:04d}-{len(state.messages)}", value)
        results.append(result)
        if result.stop_reason not in ("checkpoint", "interrupt"):
            return results, state
        value = continuation(result)
    raise AssertionError(f"the turn did not end within {max_steps} invocations")
