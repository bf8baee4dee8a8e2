"""A ``CAIRN_AGENTS`` registry holding Strands agents, as a user's ``myapp.agents`` would."""

from __future__ import annotations

from strands import Agent
from strands.agent.conversation_manager import SlidingWindowConversationManager
from strands.models.openai import OpenAIModel
from strands_sample_tools import lookup_order, refund

from service.agent.definition import AgentDefinition
from service.strands_adapter.agent import from_strands


def shop_agent(base_url: str = "http://127.0.0.1:9/v1") -> Agent:
    return Agent(
        model=OpenAIModel(
            client_args={"base_url": base_url, "api_key": "sk-local"},
            model_id="gpt-4o-mini",
            params={"temperature": 0.1, "max_completion_tokens": 512},
        ),
        system_prompt="You run the shop's refunds.",
        tools=[lookup_order, refund],
        conversation_manager=SlidingWindowConversationManager(window_size=12),
        callback_handler=None,
    )


def registry() -> dict[str, AgentDefinition]:
    return {"shop": from_strands(shop_agent(), name="shop", env={})}


def refused() -> dict[str, AgentDefinition]:
    agent = shop_agent()
    agent.state.set("cart", ["a"])
    return {"shop": from_strands(agent, name="shop", env={})}
