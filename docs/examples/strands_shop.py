"""A refund agent written for the Strands Agents SDK, hosted by Cairn.

``CAIRN_AGENTS=strands_shop:registry`` (with this folder on ``PYTHONPATH``) serves it.
"""

from __future__ import annotations

from typing import Any

from strands import Agent, ToolContext, tool
from strands.agent.conversation_manager import SlidingWindowConversationManager
from strands.models.openai import OpenAIModel

from service.agent.definition import AgentDefinition
from service.strands_adapter.agent import from_strands


@tool
def lookup_order(order_id: str) -> dict[str, Any]:
    """Look an order up.

    Args:
        order_id: The order's number.
    """
    return {"order_id": order_id, "total": 42.5, "status": "delivered"}


@tool(context=True)
def refund(order_id: str, amount: float, tool_context: ToolContext) -> str:
    """Refund an order once a human approves.

    Args:
        order_id: The order's number.
        amount: How much to refund.
    """
    answer = tool_context.interrupt("approval", reason={"order_id": order_id, "amount": amount})
    if answer != "approve":
        return f"refund of {order_id} declined"
    return f"refunded {amount} on {order_id}"


shop = Agent(
    model=OpenAIModel(model_id="gpt-4o-mini", params={"temperature": 0.2}),
    system_prompt="You handle refunds. Look the order up before you refund it.",
    tools=[lookup_order, refund],
    conversation_manager=SlidingWindowConversationManager(window_size=30),
    callback_handler=None,
)


def registry() -> dict[str, AgentDefinition]:
    return {"shop": from_strands(shop, name="shop", api_key_env="OPENAI_API_KEY")}
