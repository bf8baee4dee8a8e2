"""Strands tools the adapter tests name by import path (a module of ``@strands.tool`` functions)."""

from __future__ import annotations

from typing import Any

from strands import ToolContext, tool

CALLS: list[str] = []


@tool
def lookup_order(order_id: str) -> dict[str, Any]:
    """Look an order up.

    Args:
        order_id: The order's number.
    """
    CALLS.append(f"lookup {order_id}")
    return {"order_id": order_id, "total": 42.5}


@tool(context=True)
def refund(order_id: str, amount: float, tool_context: ToolContext) -> str:
    """Refund an order once a human approves.

    Args:
        order_id: The order's number.
        amount: How much to refund.
    """
    CALLS.append(f"refund {order_id}")
    answer = tool_context.interrupt("approval", reason={"order_id": order_id, "amount": amount})
    if answer != "approve":
        return f"refund of {order_id} declined"
    return f"refunded {amount} on {order_id}"


@tool(context=True)
def remember(note: str, tool_context: ToolContext) -> str:
    """Keep a note in the agent state and report what the context holds.

    Args:
        note: What to remember.
    """
    agent = tool_context.agent
    agent.state.set("note", note)
    return (
        f"{tool_context.tool_use['toolUseId']} {tool_context.tool_use['name']} "
        f"user={tool_context.invocation_state.get('user')} agent={agent.name} "
        f"cancelled={tool_context.cancel_signal.is_set()}"
    )


@tool
def flaky(order_id: str) -> str:
    """Fail with a ValueError.

    Args:
        order_id: The order's number.
    """
    CALLS.append(f"flaky {order_id}")
    raise ValueError(f"order {order_id} is locked")


@tool(context=True)
def peek(tool_context: ToolContext) -> str:
    """Touch what the stand-in agent does not offer."""
    return str(tool_context.agent.messages)


MIXED = [lookup_order, 3]
"""Not a tool set: one member is no tool."""
