"""A configured ``strands.Agent`` becomes the equivalent Cairn agent, or is refused saying why;
run against the real strands-agents package."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import strands_sample_tools as sample
from strands import Agent
from strands.agent.conversation_manager import (
    ConversationManager,
    NullConversationManager,
    SlidingWindowConversationManager,
    SummarizingConversationManager,
)
from strands.hooks import BeforeToolCallEvent, HookProvider, HookRegistry
from strands.models.anthropic import AnthropicModel
from strands.models.bedrock import BedrockModel
from strands.models.model import CacheConfig
from strands.models.openai import OpenAIModel
from strands.session.file_session_manager import FileSessionManager
from strands.tools.executors import SequentialToolExecutor
from strands_registry import shop_agent

from service.agent.events import Stopped
from service.agent.loop import Invocation, run_invocation
from service.agent.state import SessionState
from service.agent_config import AgentConfigError, load_agents
from service.agent_config.schema import ProviderKind
from service.providers.anthropic import AnthropicProvider
from service.providers.bedrock import BedrockProvider
from service.providers.openai_compat import OpenAICompatProvider
from service.providers.scripted import ScriptedModel, ToolCall
from service.strands_adapter.agent import bedrock_options, from_strands
from service.strands_adapter.tools import StrandsTool


def openai(**params: Any) -> OpenAIModel:
    return OpenAIModel(
        client_args={"base_url": "http://127.0.0.1:9/v1", "api_key": "sk-x"},
        model_id="gpt-4o-mini",
        params=params,
    )


def problems(agent: Agent, **kw: Any) -> str:
    with pytest.raises(AgentConfigError) as caught:
        from_strands(agent, name="a", env={}, **kw)
    return str(caught.value)


def test_prompt_tools_openai_model_and_window_are_carried_over() -> None:
    definition = from_strands(shop_agent(), name="shop", env={})
    assert definition.name == "shop"
    assert definition.system_prompt == "You run the shop's refunds."
    assert [t.name for t in definition.tools] == ["lookup_order", "refund"]
    assert all(isinstance(t, StrandsTool) for t in definition.tools)
    assert definition.executor == "concurrent", "Strands' default executor"
    assert definition.context.describe() == {"strategy": "sliding_window", "max_messages": 12}
    assert isinstance(definition.model, OpenAICompatProvider)
    config = definition.model.config
    assert config.model_id == "gpt-4o-mini"
    assert config.base_url == "http://127.0.0.1:9/v1"
    assert config.api_key is not None and config.api_key.get_secret_value() == "sk-local"
    assert (config.temperature, config.max_tokens) == (0.1, 512)
    assert config.max_tokens_param == "max_completion_tokens"


def test_openai_params_without_a_counterpart_are_sent_as_they_are() -> None:
    agent = Agent(model=openai(max_tokens=9, stop="END", seed=7, top_p=0.5), callback_handler=None)
    config = from_strands(agent, name="a", env={}).model.config
    assert isinstance(config, type(from_strands(shop_agent(), name="s", env={}).model.config))
    assert (config.max_tokens, config.max_tokens_param) == (9, "max_tokens")
    assert config.stop_sequences == ("END",)
    assert config.top_p == 0.5
    assert config.extra_body == {"seed": 7}


def test_an_api_key_variable_wins_over_the_written_key() -> None:
    agent = Agent(model=openai(), callback_handler=None)
    definition = from_strands(agent, name="a", env={"MY_KEY": "sk-env"}, api_key_env="MY_KEY")
    assert definition.model.config.api_key.get_secret_value() == "sk-env"
    with pytest.raises(AgentConfigError, match=r"'UNSET_KEY' .* is not set"):
        from_strands(agent, name="a", env={}, api_key_env="UNSET_KEY")


def test_anthropic_model_with_thinking_and_sequential_executor() -> None:
    agent = Agent(
        model=AnthropicModel(
            client_args={"api_key": "sk-ant", "base_url": "http://127.0.0.1:9"},
            model_id="claude-sonnet-4-5",
            max_tokens=8000,
            params={"thinking": {"type": "enabled", "budget_tokens": 2048}, "metadata": {"u": "1"}},
        ),
        tool_executor=SequentialToolExecutor(),
        conversation_manager=NullConversationManager(),
        callback_handler=None,
    )
    definition = from_strands(agent, name="writer", env={}, checkpointing=True)
    assert isinstance(definition.model, AnthropicProvider)
    config = definition.model.config
    assert (config.model_id, config.base_url, config.max_tokens) == (
        "claude-sonnet-4-5",
        "http://127.0.0.1:9",
        8000,
    )
    assert config.api_key.get_secret_value() == "sk-ant"
    assert config.thinking_budget_tokens == 2048
    assert config.extra_body == {"metadata": {"u": "1"}}
    assert definition.executor == "sequential"
    assert definition.context.describe() == {"strategy": "none"}
    assert definition.checkpointing is True


def test_the_summarizing_manager_maps_to_summarize_with_its_summarizer() -> None:
    helper = Agent(model=openai(), system_prompt="Summarize tersely.", callback_handler=None)
    agent = Agent(
        model=openai(),
        conversation_manager=SummarizingConversationManager(
            preserve_recent_messages=6, summarization_agent=helper
        ),
        callback_handler=None,
    )
    context = from_strands(agent, name="a", env={}).context
    assert context.describe() == {
        "strategy": "summarize",
        "max_messages": 40,
        "keep_recent": 6,
        "summarizer": "a.summarizer",
    }
    assert context.summarizer is not None
    assert context.summarizer.system_prompt == "Summarize tersely."
    prompt_only = Agent(
        model=openai(),
        conversation_manager=SummarizingConversationManager(summarization_system_prompt="Short."),
        callback_handler=None,
    )
    summarizer = from_strands(prompt_only, name="b", env={}).context.summarizer
    assert summarizer is not None and summarizer.system_prompt == "Short."


class Approvals(HookProvider):
    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeToolCallEvent, self.check)

    def check(self, event: BeforeToolCallEvent) -> None:
        return None


class KeepFirst(ConversationManager):
    def apply_management(self, agent: Any, **kwargs: Any) -> None:
        return None

    def reduce_context(self, agent: Any, e: Exception | None = None, **kwargs: Any) -> None:
        return None


def test_everything_cairn_cannot_carry_over_is_refused_at_once(tmp_path: Path) -> None:
    agent = Agent(
        model=openai(),
        hooks=[Approvals()],
        conversation_manager=KeepFirst(),
        session_manager=FileSessionManager(session_id="s", storage_dir=str(tmp_path)),
        messages=[{"role": "user", "content": [{"text": "hi"}]}],
        state={"cart": 1},
        callback_handler=None,
    )
    text = problems(agent)
    lines = text.splitlines()
    assert all(line.startswith("Strands agent 'a': ") for line in lines), text
    assert "hook Approvals cannot be carried over" in text
    assert "conversation manager KeepFirst cannot be carried over" in text
    assert "session manager FileSessionManager cannot be carried over" in text
    assert "initial messages cannot be carried over" in text
    assert "initial agent state cannot be carried over" in text


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"conversation_manager": SlidingWindowConversationManager(window_size=2)},
            "window_size 2 is below Cairn's smallest window",
        ),
        (
            {"conversation_manager": SlidingWindowConversationManager(pin_first=1)},
            "pin_first cannot be carried over",
        ),
        (
            {"conversation_manager": SlidingWindowConversationManager(proactive_compression=True)},
            "proactive_compression cannot be carried over",
        ),
    ],
)
def test_window_options_cairn_lacks_are_refused(change: dict[str, Any], expected: str) -> None:
    assert expected in problems(Agent(model=openai(), callback_handler=None, **change))


def test_other_model_providers_and_client_options_are_refused() -> None:
    class HouseModel(OpenAIModel):
        pass

    house = HouseModel(client_args={"api_key": "k"}, model_id="m")
    assert "model provider HouseModel cannot be carried over" in problems(
        Agent(model=house, callback_handler=None)
    )
    headers = OpenAIModel(client_args={"default_headers": {"x": "1"}}, model_id="m")
    assert "client_args ['default_headers'] cannot be carried over" in problems(
        Agent(model=headers, callback_handler=None)
    )


def test_a_bedrock_agent_runs_on_the_bedrock_provider() -> None:
    agent = Agent(
        model=BedrockModel(
            model_id="anthropic.claude-3-haiku", region_name="eu-west-1", temperature=0.2
        ),
        system_prompt="Be brief.",
        callback_handler=None,
    )
    adapted = from_strands(agent, name="b", env={})
    assert isinstance(adapted.model, BedrockProvider)
    config = adapted.model.config
    assert (config.model_id, config.region, config.temperature) == (
        "anthropic.claude-3-haiku",
        "eu-west-1",
        0.2,
    )
    assert adapted.system_prompt == "Be brief."


def test_cairn_agents_registry_holds_strands_agents() -> None:
    agents = load_agents("strands_registry:registry", {})
    assert list(agents) == ["shop"]
    assert (
        agents["shop"].tool_map["refund"].spec.input_schema
        == (sample.refund.tool_spec["inputSchema"]["json"])
    )
    with pytest.raises(AgentConfigError) as caught:
        load_agents("strands_registry:refused", {})
    assert "initial agent state cannot be carried over" in str(caught.value)


async def test_the_adapted_agent_runs_its_strands_tools_through_an_interrupt() -> None:
    adapted = from_strands(shop_agent(), name="shop", env={})
    scripted = ScriptedModel(
        [ToolCall("refund", {"order_id": "Z9", "amount": 3}, "t1"), "Done."], record=True
    )
    definition = dataclasses.replace(adapted, model=scripted)
    state = SessionState(session_id="s")
    events = [e async for e in run_invocation(definition, state, Invocation("c1", "refund Z9"))]
    stopped = events[-1]
    assert isinstance(stopped, Stopped) and stopped.result.stop_reason == "interrupt"
    answer = [
        {
            "interruptResponse": {
                "interruptId": stopped.result.interrupts[0].id,
                "response": "approve",
            }
        }
    ]
    events = [e async for e in run_invocation(definition, stopped.state, Invocation("c2", answer))]
    stopped = events[-1]
    assert isinstance(stopped, Stopped) and stopped.result.stop_reason == "end_turn"
    assert stopped.state.messages[2]["content"][0]["toolResult"]["content"] == [
        {"text": "refunded 3.0 on Z9"}
    ]
    assert scripted.requests[0].system_prompt == "You run the shop's refunds."


def test_a_bedrock_model_maps_to_the_bedrock_provider_options() -> None:
    model = BedrockModel(
        model_id="anthropic.claude-3-haiku",
        region_name="eu-west-1",
        temperature=0.2,
        top_p=0.9,
        max_tokens=500,
        stop_sequences=["END"],
        guardrail_id="gr-1",
        guardrail_version="2",
        guardrail_trace="enabled",
        additional_request_fields={"top_k": 5},
        cache_config=CacheConfig(system_prompt_ttl=False, tools_ttl=True),
    )
    assert bedrock_options(model) == {
        "region": "eu-west-1",
        "temperature": 0.2,
        "top_p": 0.9,
        "max_tokens": 500,
        "stop_sequences": ["END"],
        "guardrail_id": "gr-1",
        "guardrail_version": "2",
        "guardrail_trace": "enabled",
        "additional_model_request_fields": {"top_k": 5},
        "cache_tools": True,
    }
    local = BedrockModel(
        model_id="m", region_name="us-east-1", endpoint_url="http://127.0.0.1:4566"
    )
    assert bedrock_options(local) == {
        "region": "us-east-1",
        "endpoint_url": "http://127.0.0.1:4566",
    }
    hour = BedrockModel(model_id="m", region_name="us-east-1", cache_config=CacheConfig(ttl="1h"))
    with pytest.raises(AgentConfigError, match="cache_config TTLs and cache keys"):
        bedrock_options(hour)
    redacting = BedrockModel(model_id="m", region_name="us-east-1", guardrail_redact_output=True)
    with pytest.raises(AgentConfigError, match=r"\['guardrail_redact_output'\] cannot be carried"):
        bedrock_options(redacting)


@pytest.mark.skipif("bedrock" not in ProviderKind.__args__, reason="no bedrock provider yet")
def test_a_bedrock_model_runs_on_the_bedrock_provider() -> None:
    agent = Agent(
        model=BedrockModel(model_id="anthropic.claude-3-haiku", region_name="eu-west-1"),
        callback_handler=None,
    )
    definition = from_strands(agent, name="a", env={})
    assert definition.model.kind == "bedrock"
    assert (definition.model.config.model_id, definition.model.config.region) == (
        "anthropic.claude-3-haiku",
        "eu-west-1",
    )
