"""Tool tables in agents files: options written over each tool's own policy, and each refusal."""

from __future__ import annotations

from pathlib import Path

import pytest
import sample_tools  # type: ignore[import-not-found]

from service.agent.tools import DEFAULT_POLICY, Tool, ToolPolicy
from service.agent_config import AgentConfigError, load_agents

TOML = """
[[agents]]
name = "support"
model = "m"
provider = {{ type = "openai_compat" }}
tools = [{tools}]
"""


def load_tools(tmp_path: Path, tools: str) -> list[Tool]:
    path = tmp_path / "agents.toml"
    path.write_text(TOML.format(tools=tools))
    return list(load_agents(path, {})["support"].tools)


def problems_of(tmp_path: Path, tools: str) -> list[str]:
    """Each problem without its ``<file>: agent 'support': `` start (checked here)."""
    with pytest.raises(AgentConfigError) as caught:
        load_tools(tmp_path, tools)
    start = f"{tmp_path / 'agents.toml'}: agent 'support': "
    assert all(p.startswith(start) for p in caught.value.problems), caught.value.problems
    return [p.removeprefix(start) for p in caught.value.problems]


def test_table_entries_in_toml_beside_plain_paths(tmp_path: Path) -> None:
    tools = load_tools(
        tmp_path,
        '"sample_tools:lookup_order", '
        '{ path = "sample_tools:refund", effect = "once", timeout_s = 30 }, '
        '{ path = "sample_tools:add" }',
    )
    assert [(t.name, t.policy) for t in tools] == [
        ("lookup_order", DEFAULT_POLICY),
        ("refund", ToolPolicy("once", timeout_s=30)),
        ("add", DEFAULT_POLICY),
    ]


def test_table_entries_in_yaml_block_and_flow(tmp_path: Path) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text(
        "agents:\n"
        "  - name: support\n"
        "    model: m\n"
        "    provider: {type: openai_compat}\n"
        "    tools:\n"
        "      - path: sample_tools:lookup_order\n"
        "        timeout_s: 2.5\n"
        "        retries: 2\n"
        "        backoff: 0.5\n"
        "      - {path: 'sample_tools:refund', effect: once}\n"
        "      - sample_tools:add\n"
    )
    tools = load_agents(path, {})["support"].tools
    assert [(t.name, t.policy) for t in tools] == [
        ("lookup_order", ToolPolicy(timeout_s=2.5, retries=2, backoff_s=0.5)),
        ("refund", ToolPolicy("once")),
        ("add", DEFAULT_POLICY),
    ]


@pytest.mark.parametrize(
    ("entry", "policy"),
    [
        ('"sample_tools:pay"', ToolPolicy("once", timeout_s=30)),
        ('{ path = "sample_tools:pay" }', ToolPolicy("once", timeout_s=30)),
        ('{ path = "sample_tools:pay", timeout_s = 5 }', ToolPolicy("once", timeout_s=5)),
        (
            '{ path = "sample_tools:pay", effect = "idempotent", retries = 1 }',
            ToolPolicy(timeout_s=30, retries=1),
        ),
        (
            '{ path = "sample_tools:fetch_rates", retries = 1 }',
            ToolPolicy(timeout_s=10, retries=1, backoff_s=2),
        ),
        (
            '{ path = "sample_tools:fetch_rates", backoff = 0.25 }',
            ToolPolicy(timeout_s=10, retries=3, backoff_s=0.25),
        ),
        (
            '{ path = "sample_tools:fetch_rates", effect = "once", retries = 0 }',
            ToolPolicy("once", timeout_s=10, backoff_s=2),
        ),
    ],
)
def test_options_override_the_tools_own_policy_field_by_field(
    tmp_path: Path, entry: str, policy: ToolPolicy
) -> None:
    [built] = load_tools(tmp_path, entry)
    assert built.policy == policy


def test_a_yaml_null_timeout_lifts_the_tools_own(tmp_path: Path) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text(
        "agents:\n"
        "  - name: support\n"
        "    model: m\n"
        "    provider: {type: openai_compat}\n"
        "    tools: [{path: 'sample_tools:pay', timeout_s: null}]\n"
    )
    [built] = load_agents(path, {})["support"].tools
    assert built.policy == ToolPolicy("once")


def test_options_apply_to_every_tool_of_a_tool_set(tmp_path: Path) -> None:
    tools = load_tools(tmp_path, '{ path = "sample_tools:MATH", timeout_s = 2, retries = 1 }')
    assert [(t.name, t.policy) for t in tools] == [
        ("add", ToolPolicy(timeout_s=2, retries=1)),
        ("multiply", ToolPolicy(timeout_s=2, retries=1)),
    ]


def test_the_imported_tool_is_left_as_it_is(tmp_path: Path) -> None:
    [built] = load_tools(tmp_path, '{ path = "sample_tools:add", effect = "once" }')
    assert built.policy == ToolPolicy("once")
    assert sample_tools.add.policy == DEFAULT_POLICY
    [again] = load_tools(tmp_path, '"sample_tools:add"')
    assert again.policy == DEFAULT_POLICY
    assert built(2, 3) == 5  # type: ignore[operator]  # the copy calls the same function


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (
            '{ path = "sample_tools:refund", effect = "once", retries = 2 }',
            ["tool 'sample_tools:refund': retries apply only to idempotent tools, "
             "not to effect='once'"],
        ),
        (
            '{ path = "sample_tools:pay", retries = 2 }',
            ["tool 'sample_tools:pay': retries apply only to idempotent tools, "
             "not to effect='once'"],
        ),
        (
            '{ path = "sample_tools:fetch_rates", effect = "once" }',
            ["tool 'sample_tools:fetch_rates': retries apply only to idempotent tools, "
             "not to effect='once'"],
        ),
        (
            '{ path = "sample_tools:refund", timeout_s = -5 }',
            ["tool 'sample_tools:refund': timeout_s must be a positive number, not -5.0"],
        ),
        (
            '{ path = "sample_tools:refund", timeout_s = 0 }',
            ["tool 'sample_tools:refund': timeout_s must be a positive number, not 0.0"],
        ),
        (
            '{ path = "sample_tools:refund", timeout_s = inf }',
            ["tool 'sample_tools:refund': timeout_s must be a positive number, not inf"],
        ),
        (
            '{ path = "sample_tools:refund", retries = -1 }',
            ["tool 'sample_tools:refund': retries must be a whole number >= 0, not -1"],
        ),
        (
            '{ path = "sample_tools:refund", backoff = -0.5 }',
            ["tool 'sample_tools:refund': backoff must be a number of seconds >= 0, not -0.5"],
        ),
        (
            '{ path = "sample_tools:refund", effect = "twice" }',
            ["tool 'sample_tools:refund': effect: Input should be 'idempotent' or 'once'"],
        ),
        (
            '{ path = "sample_tools:refund", colour = "blue" }',
            ["tool 'sample_tools:refund': colour: Extra inputs are not permitted"],
        ),
        (
            '{ path = "sample_tools:refund", timeout_s = "30" }',
            ["tool 'sample_tools:refund': timeout_s: Input should be a valid number"],
        ),
        (
            '{ path = "sample_tools:refund", retries = 1.5 }',
            ["tool 'sample_tools:refund': retries: Input should be a valid integer"],
        ),
        (
            '{ path = "sample_tools:refund", retries = true }',
            ["tool 'sample_tools:refund': retries: Input should be a valid integer"],
        ),
        ('"sample_tools:add", { effect = "once" }', ["tools.1: path: Field required"]),
        (
            '{ path = "sample_tools:missing", retries = -1 }',
            [
                "tool 'sample_tools:missing': 'sample_tools' has no attribute 'missing'",
                "tool 'sample_tools:missing': retries must be a whole number >= 0, not -1",
            ],
        ),
        (
            '{ path = "sample_tools:missing", colour = "blue" }',
            [
                "tool 'sample_tools:missing': colour: Extra inputs are not permitted",
                "tool 'sample_tools:missing': 'sample_tools' has no attribute 'missing'",
            ],
        ),
        (
            '{ path = "sample_tools:EMPTY", backoff = -1 }',
            ["tool 'sample_tools:EMPTY': backoff must be a number of seconds >= 0, not -1.0"],
        ),
        (
            '{ path = "sample_tools:PAYMENTS", retries = 1 }',
            ["tool 'sample_tools:PAYMENTS' (pay): retries apply only to idempotent tools, "
             "not to effect='once'"],
        ),
        (
            '{ path = "sample_tools:MATH", effect = "once", retries = 1 }',
            ["tool 'sample_tools:MATH': retries apply only to idempotent tools, "
             "not to effect='once'"],
        ),
    ],
)  # fmt: skip
def test_each_invalid_table_is_refused_naming_the_agent_and_path(
    tmp_path: Path, entry: str, expected: list[str]
) -> None:
    assert problems_of(tmp_path, entry) == expected


def test_every_bad_entry_of_every_agent_is_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "agents.toml"
    path.write_text(
        TOML.format(
            tools='{ path = "sample_tools:pay", retries = 1 }, "sample_tools:add", '
            '{ path = "sample_tools:refund", effect = "never", speed = 2 }'
        )
        + TOML.format(tools='{ path = "sample_tools:add", timeout_s = -1 }').replace(
            '"support"', '"other"'
        )
    )
    with pytest.raises(AgentConfigError) as caught:
        load_agents(path, {})
    assert caught.value.problems == (
        f"{path}: agent 'support': tool 'sample_tools:pay': retries apply only to idempotent "
        "tools, not to effect='once'",
        f"{path}: agent 'support': tool 'sample_tools:refund': effect: Input should be "
        "'idempotent' or 'once'",
        f"{path}: agent 'support': tool 'sample_tools:refund': speed: Extra inputs are not "
        "permitted",
        f"{path}: agent 'other': tool 'sample_tools:add': timeout_s must be a positive number, "
        "not -1.0",
    )


@pytest.mark.parametrize(
    ("tools", "expected"),
    [
        ('{ path = "sample-tools", retries = 1 }', "'sample-tools' is not an import path"),
        ('"sample_tools:add", 42', "agents.0.tools: Value error, entry 1 is neither"),
    ],
)
def test_entries_of_the_wrong_shape_fail_with_the_file(
    tmp_path: Path, tools: str, expected: str
) -> None:
    with pytest.raises(AgentConfigError) as caught:
        load_tools(tmp_path, tools)
    [problem] = caught.value.problems
    assert problem.startswith(f"{tmp_path / 'agents.toml'}: agents.0.tools: ")
    assert expected in problem
