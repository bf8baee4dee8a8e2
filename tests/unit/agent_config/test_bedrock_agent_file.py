"""Bedrock agents in an agent file: options reach the provider, credentials never come from it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from service.agent_config import AgentConfigError, load_agents
from service.providers.bedrock import BedrockProvider

BEDROCK_TOML = """
[[agents]]
name = "assistant"
model = "us.anthropic.claude-sonnet-4-20250514-v1:0"
system_prompt = "You help."

[agents.provider]
type = "bedrock"
region = "eu-central-1"
max_tokens = 1024
temperature = 0.2
guardrail_id = "gr-abc"
guardrail_version = "3"
guardrail_trace = "enabled"
cache_system_prompt = true
additional_model_request_fields = { top_k = 50 }
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agents.toml"
    path.write_text(text)
    return path


def test_bedrock_agent_is_built_with_its_options(tmp_path: Path) -> None:
    agents = load_agents(write(tmp_path, BEDROCK_TOML), {})
    provider = agents["assistant"].model
    assert isinstance(provider, BedrockProvider)
    config = provider.config
    assert config.model_id == "us.anthropic.claude-sonnet-4-20250514-v1:0"
    assert (config.region, config.max_tokens, config.temperature) == ("eu-central-1", 1024, 0.2)
    assert (config.guardrail_id, config.guardrail_version) == ("gr-abc", "3")
    assert config.cache_system_prompt
    assert config.additional_model_request_fields == {"top_k": 50}


@pytest.mark.parametrize(
    "line",
    [
        'aws_access_key_id = "AKIAFAKEFAKEFAKE0001"',
        'aws_secret_access_key = "not-in-a-file"',
        'aws_session_token = "not-in-a-file"',
        'api_key = "not-in-a-file"',
    ],
)
def test_credentials_in_the_file_are_refused(tmp_path: Path, line: str) -> None:
    text = BEDROCK_TOML.replace('region = "eu-central-1"', f'region = "eu-central-1"\n{line}')
    with pytest.raises(AgentConfigError) as caught:
        load_agents(write(tmp_path, text), {})
    message = str(caught.value)
    assert "credentials must not be written in the file" in message
    assert "standard AWS chain" in message
    assert "not-in-a-file" not in message and "AKIAFAKE" not in message


def test_bedrock_takes_no_api_key_env(tmp_path: Path) -> None:
    text = BEDROCK_TOML.replace('type = "bedrock"', 'type = "bedrock"\napi_key_env = "AWS_KEY"')
    with pytest.raises(AgentConfigError, match="takes no api_key_env: its credentials come from"):
        load_agents(write(tmp_path, text), {"AWS_KEY": "x"})


def test_a_half_guardrail_is_refused(tmp_path: Path) -> None:
    text = BEDROCK_TOML.replace('guardrail_version = "3"\n', "")
    with pytest.raises(AgentConfigError, match="guardrail_id and guardrail_version go together"):
        load_agents(write(tmp_path, text), {})


def test_missing_sdk_names_the_bedrock_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "aiobotocore", None)
    monkeypatch.delitem(sys.modules, "aiobotocore.session", raising=False)
    with pytest.raises(AgentConfigError, match=r"pip install 'cairn\[bedrock\]'"):
        load_agents(write(tmp_path, BEDROCK_TOML), {})


def test_the_documented_bedrock_example_loads() -> None:
    example = Path(__file__).resolve().parents[3] / "docs" / "examples" / "bedrock.toml"
    agents = load_agents(example, {})
    provider = agents["assistant"].model
    assert isinstance(provider, BedrockProvider)
    config = provider.config
    assert (config.guardrail_id, config.guardrail_trace) == ("gr-0123456789ab", "enabled")
    assert config.cache_system_prompt and config.cache_tools
    assert agents["assistant"].checkpointing
