"""``cairn agents list``: shows what a deployment hosts, fails with one clear line otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.cli import main

SECRET = "sk-ant-cli-SECRET-4242"
AGENTS = """
[[agents]]
name = "local"
model = "llama3.1"
tools = ["sample_tools:add"]
provider = { type = "openai_compat", base_url = "http://localhost:11434/v1" }

[[agents]]
name = "writer"
model = "claude-sonnet-4-5"
checkpointing = true
provider = { type = "anthropic", api_key_env = "CLI_TEST_ANTHROPIC_KEY" }
limits = { max_cycles = 10 }
"""


@pytest.fixture
def agents_file(tmp_path: Path) -> Path:
    path = tmp_path / "agents.toml"
    path.write_text(AGENTS)
    return path


def test_lists_every_agent_as_a_table(
    agents_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CLI_TEST_ANTHROPIC_KEY", SECRET)
    assert main(["agents", "list", "--config", str(agents_file)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == [
        "NAME", "PROVIDER", "MODEL", "TOOLS", "EXECUTOR", "CHECKPOINTING", "LIMITS", "CONTEXT"
    ]  # fmt: skip
    assert lines[1].split() == [
        "local",
        "openai_compat",
        "llama3.1",
        "add",
        "sequential",
        "false",
        "-",
        "sliding_window(40)",
    ]
    assert lines[2].split()[:2] == ["writer", "anthropic"]
    assert "max_cycles=10" in lines[2]
    assert SECRET not in out


def test_json_output(
    agents_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CLI_TEST_ANTHROPIC_KEY", SECRET)
    assert main(["agents", "list", "--config", str(agents_file), "--json"]) == 0
    out = capsys.readouterr().out
    rows = json.loads(out)
    assert [r["name"] for r in rows] == ["local", "writer"]
    assert rows[1]["checkpointing"] is True
    assert SECRET not in out


POLICIES = """
[[agents]]
name = "shop"
model = "m"
provider = { type = "openai_compat" }
tools = [
    "sample_tools:lookup_order",
    "sample_tools:pay",
    { path = "sample_tools:refund", effect = "once" },
    { path = "sample_tools:add", retries = 2, backoff = 0.5 },
    "sample_tools:fetch_rates",
]
"""


def test_the_table_shows_each_tools_policy_unless_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "agents.toml"
    path.write_text(POLICIES)
    assert main(["agents", "list", "--config", str(path)]) == 0
    header, row = capsys.readouterr().out.splitlines()
    tools = row[header.index("TOOLS") : header.index("EXECUTOR")].rstrip()
    assert tools == (
        "lookup_order, pay (once, timeout 30s), refund (once), "
        "add (idempotent, retries 2, backoff 0.5s), "
        "fetch_rates (idempotent, timeout 10s, retries 3, backoff 2s)"
    )
    assert row[header.index("EXECUTOR") :].split()[0] == "sequential"


def test_json_adds_tool_policies_beside_the_tool_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "agents.toml"
    path.write_text(POLICIES)
    assert main(["agents", "list", "--config", str(path), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert list(row) == [
        "name", "provider", "model", "base_url", "tools", "tool_policies", "executor",
        "checkpointing", "limits", "context",
    ]  # fmt: skip
    assert row["context"] == {"strategy": "sliding_window", "max_messages": 40}
    assert row["tools"] == ["lookup_order", "pay", "refund", "add", "fetch_rates"]
    assert row["tool_policies"] == {
        "lookup_order": {"effect": "idempotent", "timeout_s": None, "retries": 0, "backoff_s": 1.0},
        "pay": {"effect": "once", "timeout_s": 30.0, "retries": 0, "backoff_s": 1.0},
        "refund": {"effect": "once", "timeout_s": None, "retries": 0, "backoff_s": 1.0},
        "add": {"effect": "idempotent", "timeout_s": None, "retries": 2, "backoff_s": 0.5},
        "fetch_rates": {"effect": "idempotent", "timeout_s": 10.0, "retries": 3, "backoff_s": 2.0},
    }


def test_a_refused_tool_table_exits_1_naming_agent_and_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "agents.toml"
    path.write_text(POLICIES.replace("retries = 2, backoff = 0.5", 'effect = "once", retries = 2'))
    assert main(["agents", "list", "--config", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        f"cairn agents list: {path}: agent 'shop': tool 'sample_tools:add': "
        "retries apply only to idempotent tools, not to effect='once'"
    ]


def test_invalid_deployment_exits_1_with_the_reason(
    agents_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CLI_TEST_ANTHROPIC_KEY", raising=False)
    assert main(["agents", "list", "--config", str(agents_file)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "agent 'writer'" in captured.err
    assert "'CLI_TEST_ANTHROPIC_KEY' (provider.api_key_env) is not set" in captured.err


def test_unknown_tool_import_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CLI_TEST_ANTHROPIC_KEY", SECRET)
    path = tmp_path / "agents.yaml"
    path.write_text(
        "agents:\n"
        "  - name: a\n"
        "    model: m\n"
        "    provider: {type: openai_compat}\n"
        "    tools: ['sample_tools:nope']\n"
    )
    assert main(["agents", "list", "--config", str(path)]) == 1
    assert "tool 'sample_tools:nope'" in capsys.readouterr().err


def test_registry_import_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agents", "list", "--config", "sample_registry:agents"]) == 0
    assert "echo" in capsys.readouterr().out


def test_agents_without_subcommand_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agents"]) == 2
    assert "list" in capsys.readouterr().err


BROKEN = """
[[agents]]
name = "first"
model = "m"
tools = ["sample_tools:nope", "sample_tools:add", "no_such_pkg.tools:x"]
hooks = ["sample_tools:add"]
provider = { type = "anthropic", api_key_env = "CLI_TEST_UNSET_KEY" }

[[agents]]
name = "second"
model = "m"
executor = "parallel"
provider = { type = "openai_compat" }

[[agents]]
name = "third"
model = "m"
provider = { type = "openai_compat", temperature = -1 }

[[agents]]
name = "first"
model = "m"
provider = { type = "openai_compat" }

[[agents]]
name = "fine"
model = "m"
provider = { type = "openai_compat" }
"""


def test_every_problem_of_every_agent_is_reported_in_one_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CLI_TEST_UNSET_KEY", raising=False)
    path = tmp_path / "agents.toml"
    path.write_text(BROKEN)
    assert main(["agents", "list", "--config", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    expected = [
        f"{path}: agents.1.executor: Input should be 'sequential' or 'concurrent'",
        f"{path}: agents: agent name 'first' is used twice",
        f"{path}: agent 'first': environment variable 'CLI_TEST_UNSET_KEY'",
        f"{path}: agent 'first': tool 'sample_tools:nope'",
        f"{path}: agent 'first': tool 'no_such_pkg.tools:x' cannot be imported",
        f"{path}: agent 'first': hook 'sample_tools:add'",
        f"{path}: agent 'third': bad openai_compat options: provider.temperature",
    ]
    assert len(lines) == len(expected), captured.err
    for line, start in zip(lines, expected, strict=True):
        assert line.startswith(f"cairn agents list: {start}"), (line, start)


UNSET_KEY_AND_TYPO = """
[[agents]]
name = "a6"
model = "gpt-4o-mini"
[agents.provider]
type = "openai_compat"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "CLI_TEST_UNSET_KEY"
temprature = 0.2
"""

GHOST_SUMMARIZER_AND_BROKEN_AGENT = """
[[agents]]
name = "a5"
model = "gpt-4o-mini"
tools = ["no_such_pkg.tools:x"]
context = { strategy = "summarize", max_messages = 10, keep_recent = 5, summarizer = "ghost" }
[agents.provider]
type = "openai_compat"
base_url = "http://127.0.0.1:9/v1"
temprature = 0.2
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            UNSET_KEY_AND_TYPO,
            [
                "agent 'a6': environment variable 'CLI_TEST_UNSET_KEY' (provider.api_key_env) "
                "is not set",
                "agent 'a6': bad openai_compat options: provider.temprature: Extra inputs",
            ],
        ),
        (
            GHOST_SUMMARIZER_AND_BROKEN_AGENT,
            [
                "agent 'a5': bad openai_compat options: provider.temprature: Extra inputs",
                "agent 'a5': tool 'no_such_pkg.tools:x' cannot be imported",
                "agent 'a5': context summarizer 'ghost' is not a valid agent of this file",
            ],
        ),
    ],
    ids=["unset-key-beside-option-typo", "ghost-summarizer-beside-unbuilt-agent"],
)
def test_one_problem_does_not_hide_another_of_the_same_agent(
    text: str,
    expected: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("CLI_TEST_UNSET_KEY", raising=False)
    path = tmp_path / "agents.toml"
    path.write_text(text)
    assert main(["agents", "list", "--config", str(path)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == len(expected), lines
    for line, start in zip(lines, expected, strict=True):
        assert line.startswith(f"cairn agents list: {path}: {start}"), (line, start)
