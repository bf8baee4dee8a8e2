"""Loading agents from TOML/YAML files and registries: valid files, every kind of invalid one."""

from __future__ import annotations

import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from service.agent.definition import AgentDefinition
from service.agent_config import AgentConfigError, describe_agents, load_agents
from service.providers.anthropic import AnthropicProvider
from service.providers.openai_compat import OpenAICompatProvider

OPENAI_SECRET = "sk-proj-SECRET-value-0123456789"
ANTHROPIC_SECRET = "sk-ant-SECRET-value-9876543210"
ENV = {"OPENAI_API_KEY": OPENAI_SECRET, "ANTHROPIC_API_KEY": ANTHROPIC_SECRET}

VALID_TOML = """
[[agents]]
name = "support"
model = "gpt-4o-mini"
system_prompt = "You help customers."
tools = ["sample_tools:lookup_order", "sample_tools:refund", "sample_tools:MATH"]
hooks = ["sample_tools:Audit"]
executor = "concurrent"
checkpointing = true

[agents.provider]
type = "openai_compat"
base_url = "http://127.0.0.1:8000/v1"
api_key_env = "OPENAI_API_KEY"
temperature = 0.2
max_tokens = 1024
retry = { max_retries = 5 }

[agents.limits]
max_cycles = 8
deadline_s = 120

[[agents]]
name = "writer"
model = "claude-sonnet-4-5"

[agents.provider]
type = "anthropic"
api_key_env = "ANTHROPIC_API_KEY"
max_tokens = 2048
"""

VALID_YAML = """
agents:
  - name: local
    model: llama3.1
    provider:
      type: openai_compat
      base_url: http://localhost:11434/v1
    tools: [sample_tools:add]
  - name: writer
    model: claude-sonnet-4-5
    provider: {type: anthropic, api_key_env: ANTHROPIC_API_KEY}
"""


def write(tmp_path: Path, text: str, name: str = "agents.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_valid_toml_builds_every_agent(tmp_path: Path) -> None:
    agents = load_agents(write(tmp_path, VALID_TOML), ENV)

    assert sorted(agents) == ["support", "writer"]
    support = agents["support"]
    assert isinstance(support, AgentDefinition)
    assert isinstance(support.model, OpenAICompatProvider)
    cfg = support.model.config
    assert (cfg.model_id, cfg.base_url, cfg.temperature, cfg.max_tokens) == (
        "gpt-4o-mini",
        "http://127.0.0.1:8000/v1",
        0.2,
        1024,
    )
    assert cfg.retry.max_retries == 5
    assert cfg.api_key is not None and cfg.api_key.get_secret_value() == OPENAI_SECRET
    assert [t.name for t in support.tools] == ["lookup_order", "refund", "add", "multiply"]
    assert support.tool_specs[1].input_schema["required"] == ["order_id", "amount"]
    assert len(support.hooks) == 1
    assert (support.executor, support.checkpointing) == ("concurrent", True)
    assert (support.limits.max_cycles, support.limits.deadline_s) == (8, 120)
    assert support.system_prompt == "You help customers."

    writer = agents["writer"]
    assert isinstance(writer.model, AnthropicProvider)
    assert writer.model.config.api_key.get_secret_value() == ANTHROPIC_SECRET
    assert writer.model.config.max_tokens == 2048
    assert (writer.executor, writer.checkpointing, writer.tools) == ("sequential", False, [])


def test_valid_yaml_builds_every_agent(tmp_path: Path) -> None:
    agents = load_agents(str(write(tmp_path, VALID_YAML, "agents.yaml")), ENV)
    local = agents["local"]
    assert isinstance(local.model, OpenAICompatProvider)
    assert local.model.config.api_key is None
    assert [t.name for t in local.tools] == ["add"]
    assert isinstance(agents["writer"].model, AnthropicProvider)


def test_registry_import_path_is_accepted() -> None:
    agents = load_agents("sample_registry:agents", ENV)
    assert list(agents) == ["echo"]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (('"sample_tools:lookup_order"', '"no_such_pkg.tools:lookup"'), "cannot be imported"),
        (('"sample_tools:lookup_order"', '"sample_tools:missing"'), "has no attribute 'missing'"),
        (('"sample_tools:lookup_order"', '"sample_tools:NOT_A_TOOL"'), "is a int, not a tool"),
        (('"sample_tools:lookup_order"', '"sample-tools"'), "is not an import path"),
        (('"sample_tools:lookup_order"', '"sample_tools"'), "a module holding no Strands tools"),
        (('"sample_tools:lookup_order"', '"broken_tools:x"'), "RuntimeError: database URL missing"),
        (('"sample_tools:Audit"', '"sample_tools:add"'), "not a HookProvider"),
        (("temperature = 0.2", "temperature = -1"), "provider.temperature"),
        (("temperature = 0.2", "temprature = 0.2"), "provider.temprature: Extra inputs"),
        (("max_tokens = 1024", 'max_tokens_param = "max_len"'), "provider.max_tokens_param"),
        (('base_url = "http://127.0.0.1:8000/v1"', 'base_url = "ftp://x"'), "http:// or https://"),
        (('type = "openai_compat"', 'type = "vertex"'), "agents.0.provider.type"),
        (
            ('"OPENAI_API_KEY"', '"NOT_SET_ANYWHERE"'),
            "'NOT_SET_ANYWHERE' (provider.api_key_env) is not set",
        ),
        (
            ('api_key_env = "OPENAI_API_KEY"', 'api_key = "sk-inline"'),
            "must not be written in the file",
        ),
        (('executor = "concurrent"', 'executor = "parallel"'), "agents.0.executor"),
        (("max_cycles = 8", "max_cycles = 0"), "agents.0.limits.max_cycles"),
        (('name = "writer"', 'name = "support"'), "'support' is used twice"),
        (('name = "writer"', 'name = "bad name!"'), "agents.1.name"),
        (('api_key_env = "ANTHROPIC_API_KEY"', ""), "provider 'anthropic' needs api_key_env"),
        (('model = "gpt-4o-mini"', "colour = 'blue'"), "agents.0.model: Field required"),
        (("[agents.limits]", "[agents.limits\n"), "not valid TOML"),
    ],
)
def test_each_kind_of_invalid_file_fails_clearly(
    tmp_path: Path, change: tuple[str, str], expected: str
) -> None:
    old, new = change
    assert old in VALID_TOML
    with pytest.raises(AgentConfigError) as caught:
        load_agents(write(tmp_path, VALID_TOML.replace(old, new, 1)), ENV)
    assert expected in str(caught.value)
    assert OPENAI_SECRET not in str(caught.value)
    assert ANTHROPIC_SECRET not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "top level must be a table"),
        ("agents: []", "agents: List should have at least 1 item"),
        ("- just\n- a list", "top level must be a table"),
        ("agents: [{name: x", "not valid YAML"),
        ("version: 2\nagents: []", "version: Extra inputs"),
    ],
)
def test_invalid_yaml_files(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(AgentConfigError, match=expected.replace("[", r"\[")):
        load_agents(write(tmp_path, text, "agents.yml"), ENV)


def test_missing_file_and_unknown_source(tmp_path: Path) -> None:
    with pytest.raises(AgentConfigError, match="cannot read"):
        load_agents(tmp_path / "absent.toml", ENV)
    with pytest.raises(AgentConfigError, match="neither"):
        load_agents("agents", ENV)
    with pytest.raises(AgentConfigError, match="agent registry 'no_such_pkg:agents'"):
        load_agents("no_such_pkg:agents", ENV)


def test_validation_errors_never_echo_values(tmp_path: Path) -> None:
    text = VALID_TOML.replace("temperature = 0.2", "organization = 31415926535")
    with pytest.raises(AgentConfigError) as caught:
        load_agents(write(tmp_path, text), ENV)
    assert "provider.organization" in str(caught.value)
    assert "31415926535" not in str(caught.value)


def test_missing_sdk_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "anthropic", None)
    with pytest.raises(AgentConfigError, match=r"pip install 'cairn\[anthropic\]'"):
        load_agents(write(tmp_path, VALID_TOML), ENV)


def test_secrets_never_in_logs_or_results(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    agents = load_agents(write(tmp_path, VALID_TOML), ENV)
    shown: list[Any] = [
        describe_agents(agents),
        repr(agents),
        str(agents),
        [repr(a.model.config) for a in agents.values()],  # type: ignore[attr-defined]
        [a.model.config.model_dump_json() for a in agents.values()],  # type: ignore[attr-defined]
        caplog.text,
    ]
    for item in shown:
        assert OPENAI_SECRET not in str(item)
        assert ANTHROPIC_SECRET not in str(item)
    assert "agent=<support>" in caplog.text


def test_describe_agents_lists_what_is_hosted(tmp_path: Path) -> None:
    described = describe_agents(load_agents(write(tmp_path, VALID_TOML), ENV))
    assert described[0] == {
        "name": "support",
        "provider": "openai_compat",
        "model": "gpt-4o-mini",
        "base_url": "http://127.0.0.1:8000/v1",
        "tools": ["lookup_order", "refund", "add", "multiply"],
        "tool_policies": {
            name: {"effect": "idempotent", "timeout_s": None, "retries": 0, "backoff_s": 1.0}
            for name in ["lookup_order", "refund", "add", "multiply"]
        },
        "executor": "concurrent",
        "checkpointing": True,
        "limits": {"max_cycles": 8, "max_tokens": None, "deadline_s": 120.0},
        "context": {"strategy": "sliding_window", "max_messages": 40},
    }
    assert described[1]["provider"] == "anthropic"


def test_every_problem_of_every_agent_is_found_before_failing(tmp_path: Path) -> None:
    text = VALID_TOML.replace('"sample_tools:refund"', '"sample_tools:missing"').replace(
        'model = "claude-sonnet-4-5"',
        'model = "claude-sonnet-4-5"\ncontext = { strategy = "sliding_window", max_messages = 2 }',
    )
    with pytest.raises(AgentConfigError) as caught:
        load_agents(write(tmp_path, text), {})
    problems = caught.value.problems
    assert len(problems) == 4, problems
    assert "agent 'support': environment variable 'OPENAI_API_KEY'" in problems[0]
    assert "agent 'support': tool 'sample_tools:missing'" in problems[1]
    assert "agent 'writer': environment variable 'ANTHROPIC_API_KEY'" in problems[2]
    assert "agent 'writer': context max_messages" in problems[3]
    assert str(caught.value) == "\n".join(problems)


def test_a_name_used_twice_is_reported_once_beside_other_problems(tmp_path: Path) -> None:
    twice = VALID_TOML.replace('name = "writer"', 'name = "support"')
    with pytest.raises(AgentConfigError) as caught:
        load_agents(write(tmp_path, twice), ENV)
    assert [p for p in caught.value.problems if "used twice" in p] == [
        f"{tmp_path / 'agents.toml'}: agents: Value error, agent name 'support' is used twice"
    ]
    with pytest.raises(AgentConfigError) as caught:
        load_agents(write(tmp_path, twice.replace("max_cycles = 8", "max_cycles = 0")), {})
    problems = caught.value.problems
    assert [p for p in problems if "used twice" in p] == [
        f"{tmp_path / 'agents.toml'}: agents: agent name 'support' is used twice"
    ]
    assert any("agents.0.limits.max_cycles" in p for p in problems)


EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "long-conversations.toml"

CONTEXT_AGENTS = """
[[agents]]
name = "a"
model = "m"
context = CONTEXT
[agents.provider]
type = "openai_compat"
base_url = "http://127.0.0.1:8000/v1"

[[agents]]
name = "b"
model = "m"
system_prompt = "You summarize."
[agents.provider]
type = "openai_compat"
base_url = "http://127.0.0.1:8000/v1"
"""


def test_the_documented_context_example_loads_with_its_summarizer() -> None:
    agents = load_agents(EXAMPLE, ENV)
    researcher = agents["researcher"].context
    assert (researcher.strategy, researcher.max_messages, researcher.keep_recent) == (
        "summarize",
        30,
        8,
    )
    assert researcher.summarizer is agents["notes"]
    assert agents["notes"].context.strategy == "none"
    assert agents["local-chat"].context.max_messages == 16


@pytest.mark.parametrize(
    ("context", "strategy", "max_messages"),
    [
        ('"none"', "none", 40),
        ('{ strategy = "sliding_window", max_messages = 12 }', "sliding_window", 12),
        ('{ strategy = "summarize", summarizer = "b" }', "summarize", 40),
    ],
)
def test_context_in_an_agent_file(context: str, strategy: str, max_messages: int) -> None:
    agents = _load_context(context)
    policy = agents["a"].context
    assert (policy.strategy, policy.max_messages) == (strategy, max_messages)
    assert agents["b"].context.strategy == "sliding_window", "the default"
    if strategy == "summarize":
        assert policy.summarizer is agents["b"]


def _load_context(context: str) -> dict[str, AgentDefinition]:
    with tempfile.TemporaryDirectory() as folder:
        return load_agents(write(Path(folder), CONTEXT_AGENTS.replace("CONTEXT", context)), {})


@pytest.mark.parametrize(
    ("context", "problem"),
    [
        ('"window"', "context.strategy"),
        ('{ strategy = "summarize", summarizer = "c" }', "summarizer 'c' is not a valid agent"),
        ('{ strategy = "summarize", summarizer = "a" }', "not the agent itself"),
        ('{ summarizer = "b" }', "needs strategy 'summarize'"),
        ('{ max_messages = "40" }', "context.max_messages"),
        ("{ max_messages = 2 }", "at least 3"),
        ('{ strategy = "summarize", keep_recent = 40 }', "between 1 and max_messages - 2"),
        ("{ window = 40 }", "context.window"),
    ],
)
def test_a_bad_context_is_refused(context: str, problem: str) -> None:
    with pytest.raises(AgentConfigError) as caught:
        _load_context(context)
    assert any(problem in p for p in caught.value.problems), caught.value.problems
