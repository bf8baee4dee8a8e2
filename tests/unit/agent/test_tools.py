"""Tools: spec from hints and docstrings, result and error mapping, the tool context."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from engine_helpers import call, invoke, make_agent, results_of

from service.agent.cancel import CancelSignal
from service.agent.results import tool_name_error
from service.agent.state import SessionState
from service.agent.tools import FunctionTool, ToolContext, tool


def new_state() -> SessionState:
    return SessionState(session_id="sess-9")


def test_spec_from_type_hints_and_google_docstring() -> None:
    @tool
    def search(query: str, limit: int = 5, tags: list[str] | None = None) -> str:
        """Search the catalogue.

        Longer explanation.

        Args:
            query: What to look for.
            limit: How many hits
                at most.
            tags: Optional filters.

        Returns:
            The hits.
        """
        return query

    assert search.spec.name == "search"
    assert search.spec.description == "Search the catalogue.\n\nLonger explanation."
    schema = search.spec.input_schema
    assert schema["type"] == "object"
    assert schema["required"] == ["query"]
    assert schema["properties"]["query"] == {"type": "string", "description": "What to look for."}
    assert schema["properties"]["limit"]["description"] == "How many hits at most."
    assert schema["properties"]["limit"]["default"] == 5
    assert "title" not in schema


def test_spec_with_sphinx_docstring_context_param_and_overrides() -> None:
    @tool(name="renamed", description="Custom.")
    async def fetch(url: str, title: str, context: ToolContext) -> str:
        """Fetch.

        :param url: Where from.
        :param title: A property literally called title.
        """
        return url

    assert fetch.spec.name == "renamed" and fetch.spec.description == "Custom."
    props = fetch.spec.input_schema["properties"]
    assert set(props) == {"url", "title"}, "the context parameter is not part of the schema"
    assert props["url"]["description"] == "Where from."
    assert isinstance(fetch, FunctionTool) and fetch.context_param == "context"


def test_decorated_function_still_callable() -> None:
    @tool
    def double(x: int) -> int:
        """Double."""
        return x * 2

    assert double(4) == 8


@tool(inline=True)
def returns(kind: str) -> Any:
    """Return a value of the requested kind."""
    values: dict[str, Any] = {
        "str": "plain",
        "dict": {"a": 1},
        "list": [1, "two"],
        "int": 7,
        "none": None,
        "result": {"status": "error", "content": [{"text": "custom"}]},
        "object": object.__new__(type("Thing", (), {"__str__": lambda self: "thing"})),
    }
    return values[kind]


@tool(inline=True)
def raises(kind: str) -> str:
    """Raise an exception of the requested kind."""
    if kind == "value":
        raise ValueError("bad input")
    if kind == "key":
        raise KeyError("missing")
    raise RuntimeError("it broke")


@pytest.mark.parametrize(
    ("kind", "status", "content"),
    [
        ("str", "success", [{"text": "plain"}]),
        ("dict", "success", [{"text": '{"a": 1}'}]),
        ("list", "success", [{"text": '[1, "two"]'}]),
        ("int", "success", [{"text": "7"}]),
        ("none", "success", [{"text": "null"}]),
        ("result", "error", [{"text": "custom"}]),
        ("object", "success", [{"text": "thing"}]),
    ],
)
async def test_return_value_mapping(kind: str, status: str, content: list[Any]) -> None:
    agent = make_agent(
        [call("returns", "r", kind=kind), "ok"], checkpointing=False, tools=[returns]
    )
    out = await invoke(agent, new_state(), "go")
    assert results_of(out.state.messages[2]) == [
        {"toolUseId": "r", "status": status, "content": content}
    ]


@pytest.mark.parametrize(
    ("kind", "text"),
    [
        ("value", "Error: bad input"),
        ("key", "Error: KeyError - 'missing'"),
        ("runtime", "Error: RuntimeError - it broke"),
    ],
)
async def test_exception_mapping(kind: str, text: str) -> None:
    agent = make_agent([call("raises", "r", kind=kind), "ok"], checkpointing=False, tools=[raises])
    out = await invoke(agent, new_state(), "go")
    assert results_of(out.state.messages[2]) == [
        {"toolUseId": "r", "status": "error", "content": [{"text": text}]}
    ]


async def test_invalid_input_and_unknown_tool_become_error_results() -> None:
    script = [[call("raises", "a", wrong=1), call("nope", "b")], "ok"]
    agent = make_agent(script, checkpointing=False, tools=[raises])
    out = await invoke(agent, new_state(), "go")
    first, second = results_of(out.state.messages[2])
    assert first["status"] == "error"
    assert first["content"][0]["text"].startswith("Error: Validation failed for input parameters: ")
    assert "validation error" in first["content"][0]["text"]
    assert second == {
        "toolUseId": "b",
        "status": "error",
        "content": [{"text": "Unknown tool: nope"}],
    }


SEEN: list[dict[str, Any]] = []


@tool
def inspect_context(context: ToolContext) -> str:
    """Record what the context holds; runs in a worker thread."""
    SEEN.append(
        {
            "session_id": context.session_id,
            "tool_use_id": context.tool_use_id,
            "key": context.idempotency_key,
            "thread": threading.current_thread() is threading.main_thread(),
            "invocation_state": dict(context.invocation_state),
            "cancel_set": context.cancel.is_set,
        }
    )
    context.agent_state["visits"] = context.agent_state.get("visits", 0) + 1
    return "ok"


async def test_tool_context_and_agent_state() -> None:
    SEEN.clear()
    agent = make_agent(
        [call("inspect_context", "tu-1"), "ok"], checkpointing=False, tools=[inspect_context]
    )
    out = await invoke(agent, new_state(), "go", invocation_state={"user": "ann"})
    assert SEEN == [
        {
            "session_id": "sess-9",
            "tool_use_id": "tu-1",
            "key": "sess-9:tu-1",
            "thread": False,
            "invocation_state": {"user": "ann"},
            "cancel_set": False,
        }
    ]
    assert out.state.agent_state == {"visits": 1}
    assert out.result.state == {"visits": 1}


async def test_idempotency_key_is_stable_across_a_replay() -> None:
    SEEN.clear()
    agent = make_agent([call("inspect_context"), "ok"], tools=[inspect_context])
    paused = await invoke(agent, new_state(), "go")
    from engine_helpers import resume, roundtrip

    await invoke(agent, roundtrip(paused.state), resume(paused))
    await invoke(
        make_agent([call("inspect_context"), "ok"], tools=[inspect_context]),
        roundtrip(paused.state),
        resume(paused),
    )
    assert len(SEEN) == 2 and SEEN[0]["key"] == SEEN[1]["key"]


@pytest.mark.parametrize(
    ("use", "text"),
    [
        ({"name": "echo"}, None),
        ({"name": "A-z_09"}, None),
        ({"name": "a" * 64}, None),
        ({"name": "echo\n"}, None),
        ({}, "Error: tool name missing"),
        ({"name": ""}, "Error: tool_name=<> | invalid tool name pattern"),
        ({"name": "\u00e9cho"}, "Error: tool_name=<\u00e9cho> | invalid tool name pattern"),
        ({"name": "a.b"}, "Error: tool_name=<a.b> | invalid tool name pattern"),
        ({"name": "\necho"}, "Error: tool_name=<\necho> | invalid tool name pattern"),
        ({"name": 5}, "Error: tool_name=<5> | invalid tool name pattern"),
        ({"name": None}, "Error: tool_name=<None> | invalid tool name pattern"),
        (
            {"name": "a" * 65},
            f"Error: tool_name=<{'a' * 65}>, tool_name_max_length=<64> | invalid tool name length",
        ),
        ({"name": "a " * 40}, f"Error: tool_name=<{'a ' * 40}> | invalid tool name pattern"),
    ],
)
def test_the_name_check_texts(use: dict[str, Any], text: str | None) -> None:
    assert tool_name_error(use) == text


@pytest.mark.parametrize(("value", "kind"), [(None, "NoneType"), ([], "list"), (1.5, "float")])
async def test_a_function_tool_refuses_input_that_is_not_an_object(value: Any, kind: str) -> None:
    calls: list[str] = []

    @tool
    def greet(name: str = "x") -> str:
        """Greet."""
        calls.append(name)
        return name

    context = ToolContext("s", "t1", CancelSignal())
    with pytest.raises(ValueError) as raised:
        await greet.invoke(value, context)
    assert str(raised.value) == (
        "Validation failed for input parameters: strands.tools.decorator.GreetTool()"
        f" argument after ** must be a mapping, not {kind}"
    )
    assert calls == []
    assert await greet.invoke({}, context) == "x"
