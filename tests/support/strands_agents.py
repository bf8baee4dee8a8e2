"""A ``CAIRN_AGENTS`` registry of Strands agents for the service processes of the runtime tests.

The agent is a configured ``strands.Agent`` carried over by ``from_strands``; its model is then
swapped for a scripted one that answers by conversation position, so every instance, and a
replay, gives the same reply. Each run of the Strands tool is appended to the tool log.
"""

from __future__ import annotations

import dataclasses
import os

from strands import Agent, ToolContext, tool
from strands.models.openai import OpenAIModel

from service.agent.definition import AgentDefinition
from service.providers.scripted import ScriptedModel, ToolCall
from service.strands_adapter.agent import from_strands
from tests.support.agents import _append


@tool(context=True)
def refund(order_id: str, tool_context: ToolContext) -> str:
    """Refund an order once a human approves.

    Args:
        order_id: The order's number.
    """
    _append(
        "CAIRN_TEST_TOOL_LOG",
        {"tool": "refund", "pid": os.getpid(), "id": tool_context.tool_use["toolUseId"]},
    )
    answer = tool_context.interrupt("approval", reason={"order_id": order_id})
    return f"refund of {order_id}: {answer}"


def registry() -> dict[str, AgentDefinition]:
    shop = Agent(
        model=OpenAIModel(
            client_args={"base_url": "http://127.0.0.1:9/v1", "api_key": "unused"},
            model_id="gpt-4o-mini",
        ),
        system_prompt="You run the shop's refunds.",
        tools=[refund],
        callback_handler=None,
    )
    adapted = from_strands(shop, name="strands-shop", env={})
    script = [ToolCall("refund", {"order_id": "A1"}, "t1"), "Refund done."]
    model = ScriptedModel(script, mode="conversation")
    return {"strands-shop": dataclasses.replace(adapted, model=model)}
