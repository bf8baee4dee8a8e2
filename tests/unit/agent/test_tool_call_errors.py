"""Error results that do not come from a tool raising, as the reference's tool hooks see them.

Every expected value was observed by running the same scenario through strands-agents 1.62.0
(``strands.Agent`` with a scripted model and a hook provider recording the events): a call a
before-tool-call hook skipped, an input its validation refuses, a tool the agent does not have
and a toolUse without an ``input``.
"""

from __future__ import annotations

from typing import Any

import pytest
from engine_helpers import ToolHookLog, add, call, echo, invoke, make_agent

from service.agent.state import SessionState
from service.agent.tools import tool
from service.providers.scripted import ScriptedReply

PINGS: list[str] = []


@tool(inline=True)
def ping() -> str:
    """Answer pong."""
    PINGS.append("ping")
    return "pong"


TOOLS = [echo, add, ping]


def new_state() -> SessionState:
    return SessionState(session_id="s-errors")


def err(tool_use_id: str, text: str) -> dict[str, Any]:
    return {"toolUseId": tool_use_id, "status": "error", "content": [{"text": text}]}


def after_calls(log: ToolHookLog) -> list[dict[str, Any]]:
    return [entry[1] for entry in log.take() if entry[0] == "after_call"]


@pytest.mark.parametrize("executor", ["sequential", "concurrent"])
@pytest.mark.parametrize(("cancel", "text"), [(True, "tool cancelled by user"), ("no", "no")])
async def test_a_call_a_hook_skipped_has_no_selected_tool(
    executor: str, cancel: bool | str, text: str
) -> None:
    log = ToolHookLog(cancel={"echo": cancel})
    agent = make_agent(
        [call("echo", "t1", text="a"), "done"],
        checkpointing=False,
        executor=executor,
        tools=TOOLS,
        hooks=[log],
    )
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "end_turn"
    assert after_calls(log) == [
        {
            "tool_use": {"toolUseId": "t1", "name": "echo", "input": {"text": "a"}},
            "selected_tool": None,
            "result": err("t1", text),
            "exception": None,
            "cancel_message": text,
            "duration": None,
        }
    ]


NOT_A_MAPPING = (
    "Validation failed for input parameters: strands.tools.decorator.AddTool() argument after **"
    " must be a mapping, not list"
)


@pytest.mark.parametrize(
    ("tool_input", "opening"),
    [
        (
            {"a": "x", "b": 1},
            "Validation failed for input parameters: 1 validation error for "
            "AddTool\na\n  Input should be a valid integer",
        ),
        (
            {"a": 1},
            "Validation failed for input parameters: 1 validation error for AddTool\nb\n"
            "  Field required",
        ),
        ([1], NOT_A_MAPPING),
    ],
)
async def test_an_input_the_validation_refuses_is_seen_as_its_value_error(
    tool_input: Any, opening: str
) -> None:
    # The reference's decorated tool raises ValueError('Validation failed ...') and its
    # executor passes that exception on to the after-tool-call hooks.
    log = ToolHookLog()
    reply = ScriptedReply(
        content=[{"toolUse": {"toolUseId": "t1", "name": "add", "input": tool_input}}]
    )
    agent = make_agent([reply, "done"], checkpointing=False, tools=TOOLS, hooks=[log])
    await invoke(agent, new_state(), "go")
    [seen] = after_calls(log)
    exception = seen["exception"]
    assert type(exception) is ValueError
    assert str(exception).startswith(opening), str(exception)
    assert seen["result"] == err("t1", f"Error: {exception}")
    assert seen["selected_tool"] == "add"
    assert seen["cancel_message"] is None
    assert seen["duration"] is not None


async def test_a_tool_the_agent_lacks_is_seen_as_an_unknown_tool_exception() -> None:
    log = ToolHookLog()
    agent = make_agent(
        [call("missing", "t1", x=1), "done"], checkpointing=False, tools=TOOLS, hooks=[log]
    )
    await invoke(agent, new_state(), "go")
    [seen] = after_calls(log)
    assert type(seen["exception"]) is Exception
    assert str(seen["exception"]) == "Unknown tool: missing"
    assert seen["result"] == err("t1", "Unknown tool: missing")
    assert seen["selected_tool"] is None


def asked(*uses: dict[str, Any]) -> list[dict[str, Any]]:
    """A prompt of messages ending with the assistant's tool calls (run without a model call)."""
    return [
        {"role": "user", "content": [{"text": "go"}]},
        {"role": "assistant", "content": [{"toolUse": use} for use in uses]},
    ]


@pytest.mark.parametrize("executor", ["sequential", "concurrent"])
async def test_a_tool_use_without_input_is_not_run_and_gets_the_references_key_error(
    executor: str,
) -> None:
    # The reference's executor reads tool_use["input"] to open the call's span, before it
    # looks the tool up or runs it: its KeyError becomes the result, for any tool.
    PINGS.clear()
    log = ToolHookLog()
    agent = make_agent(
        ["done"],
        checkpointing=False,
        executor=executor,
        tools=TOOLS,
        hooks=[log],
        mode="sequential",
    )
    prompt = asked(
        {"toolUseId": "t1", "name": "ping"},
        {"toolUseId": "t2", "name": "missing"},
        {"toolUseId": "t3", "name": "ping", "input": {}},
    )
    out = await invoke(agent, new_state(), prompt)
    assert out.stop == "end_turn"
    assert PINGS == ["ping"]
    assert out.state.messages[1] == prompt[1]
    assert out.state.messages[2] == {
        "role": "user",
        "content": [
            {"toolResult": err("t1", "Error: 'input'")},
            {"toolResult": err("t2", "Error: 'input'")},
            {
                "toolResult": {
                    "toolUseId": "t3",
                    "status": "success",
                    "content": [{"text": "pong"}],
                }
            },
        ],
    }
    seen = sorted(after_calls(log), key=lambda s: s["tool_use"]["toolUseId"])
    assert [(s["selected_tool"], type(s["exception"]), s["cancel_message"]) for s in seen] == [
        ("ping", KeyError, None),
        (None, KeyError, None),
        ("ping", type(None), None),
    ]
    assert [str(s["exception"]) for s in seen[:2]] == ["'input'", "'input'"]
    assert all(s["duration"] is not None for s in seen)


async def test_a_model_reply_without_input_gets_an_empty_one_and_runs() -> None:
    # The reference's stream processor gives each toolUse of a reply an input ({} when the
    # model sent none): its history and its hooks have it, and the tool runs with no arguments.
    PINGS.clear()
    log = ToolHookLog()
    reply = ScriptedReply(content=[{"toolUse": {"toolUseId": "t1", "name": "ping"}}])
    agent = make_agent([reply, "done"], checkpointing=False, tools=TOOLS, hooks=[log])
    out = await invoke(agent, new_state(), "go")
    filled = {"toolUse": {"toolUseId": "t1", "name": "ping", "input": {}}}
    assert out.state.messages[1] == {"role": "assistant", "content": [filled]}
    assert PINGS == ["ping"]
    assert ("added", {"role": "assistant", "content": [filled]}) in log.seen
    [seen] = after_calls(log)
    assert seen["tool_use"] == filled["toolUse"]
    assert seen["exception"] is None
