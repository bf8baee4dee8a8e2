"""Values the session cannot store never get into it: the command still ends normally.

A tool result the session codec cannot encode (or that lacks the toolResult shape) becomes the
tool's error result; an unstorable agent-state write (by a tool or a hook) is reverted.
"""

from __future__ import annotations

import datetime
from typing import Any

import orjson
import pytest
from engine_helpers import call, check_history, invoke, make_agent, results_of, roundtrip

from service.agent.errors import UnstorableError
from service.agent.hooks import (
    AfterInvocationEvent,
    AfterToolCallEvent,
    BeforeInvocationEvent,
    HookProvider,
    HookRegistry,
)
from service.agent.state import SessionState
from service.agent.storable import StateGuard, stored_form
from service.agent.tools import ToolContext, tool
from service.sessions.codec import encode_state

STORE_ERROR = "Error: the tool's result could not be stored: "

BAD_RESULTS: dict[str, tuple[Any, str]] = {
    "big_int": (
        {"status": "success", "content": [{"json": {"n": 2**64}}]},
        "Integer exceeds 64-bit range",
    ),
    "set": (
        {"status": "success", "content": [{"json": {"ids": {1, 2}}}]},
        "not JSON serializable: set",
    ),
    "surrogate_in_result": (
        {"status": "success", "content": [{"text": "half \ud800 of a pair"}]},
        "surrogates not allowed",
    ),
    "surrogate_text": ("half \ud800 of a pair", "surrogates not allowed"),
    "status": (
        {"status": "done", "content": [{"text": "x"}]},
        "status must be 'success' or 'error', not 'done'",
    ),
    "content": ({"status": "success", "content": "x"}, "content must be a list of blocks"),
    "block": (
        {"status": "success", "content": [{"text": "x", "json": 1}]},
        "content[0] must be an object with exactly one key",
    ),
    "text": ({"status": "error", "content": [{"text": 5}]}, "content[0].text must be a string"),
}


@tool(inline=True)
def returns_bad(kind: str) -> Any:
    """Return a value the session cannot store as it is."""
    return BAD_RESULTS[kind][0]


@tool(inline=True)
def returns_datetime() -> Any:
    """Return an encodable value that is not plain JSON."""
    when = datetime.datetime(2024, 5, 1, 12, 30, tzinfo=datetime.UTC)
    return {"status": "success", "content": [{"json": {"when": when, "pair": (1, 2)}}]}


@tool(inline=True)
def returns_image() -> Any:
    """Return an image and a document as raw bytes, as a Strands tool would."""
    return {
        "status": "success",
        "content": [
            {"image": {"format": "png", "source": {"bytes": b"\x89PNG"}}},
            {"document": {"format": "txt", "name": "d", "source": {"bytes": bytearray(b"hi")}}},
        ],
    }


@tool(inline=True)
def writes_state(kind: str, context: ToolContext) -> str:
    """Write a good and a bad value into agent state."""
    context.agent_state["good"] = "new"
    bad: dict[str, Any] = {"set": {1, 2}, "big": 2**70, "surrogate": "\udfff"}
    if kind == "key":
        context.agent_state[7] = "not a string key"
    else:
        context.agent_state[kind] = bad[kind]
    return "wrote"


def new_state(agent_state: dict[str, Any] | None = None) -> SessionState:
    return SessionState(session_id="s-storable", agent_state=agent_state or {})


def stores(state: SessionState) -> None:
    """The session codec encodes the state, and it comes back equal."""
    assert roundtrip(state) == state


@pytest.mark.parametrize("kind", sorted(BAD_RESULTS))
async def test_an_unstorable_tool_result_becomes_its_error_result(kind: str) -> None:
    agent = make_agent(
        [call("returns_bad", "t", kind=kind), "done"], checkpointing=False, tools=[returns_bad]
    )
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "end_turn"
    [result] = results_of(out.state.messages[2])
    assert result["status"] == "error"
    [block] = result["content"]
    assert block["text"].startswith(STORE_ERROR)
    assert BAD_RESULTS[kind][1] in block["text"]
    check_history(out.state)
    stores(out.state)


async def test_the_checkpoint_after_an_unstorable_result_can_be_stored() -> None:
    agent = make_agent([call("returns_bad", "t", kind="set"), "done"], tools=[returns_bad])
    paused = await invoke(agent, new_state(), "go")
    out = await invoke(agent, paused.state, {"checkpointResume": {"checkpoint": paused.checkpoint}})
    assert out.stop == "checkpoint"
    assert results_of(out.state.messages[2])[0]["status"] == "error"
    encode_state(out.state)


async def test_an_encodable_non_json_result_is_kept_in_its_stored_form() -> None:
    agent = make_agent(
        [call("returns_datetime", "t"), "done"], checkpointing=False, tools=[returns_datetime]
    )
    out = await invoke(agent, new_state(), "go")
    [result] = results_of(out.state.messages[2])
    assert result == {
        "status": "success",
        "content": [{"json": {"when": "2024-05-01T12:30:00+00:00", "pair": [1, 2]}}],
        "toolUseId": "t",
    }
    stores(out.state)


async def test_raw_bytes_in_a_result_are_kept_as_their_base64_text() -> None:
    agent = make_agent(
        [call("returns_image", "t"), "done"], checkpointing=False, tools=[returns_image]
    )
    out = await invoke(agent, new_state(), "go")
    [result] = results_of(out.state.messages[2])
    assert result["status"] == "success"
    assert result["content"] == [
        {"image": {"format": "png", "source": {"bytes": "iVBORw=="}}},
        {"document": {"format": "txt", "name": "d", "source": {"bytes": "aGk="}}},
    ]
    stores(out.state)


async def test_a_result_a_hook_made_unstorable_becomes_an_error_result() -> None:
    class Spoil(HookProvider):
        def register_hooks(self, registry: HookRegistry) -> None:
            registry.add_callback(AfterToolCallEvent, self.spoil)

        def spoil(self, event: AfterToolCallEvent) -> None:
            event.result["toolResult"]["content"].append({"json": object()})

    agent = make_agent([call("echo", "e", text="a"), "done"], checkpointing=False, hooks=[Spoil()])
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "end_turn"
    [result] = results_of(out.state.messages[2])
    assert result["status"] == "error"
    assert result["content"][0]["text"].startswith(STORE_ERROR)
    stores(out.state)


@pytest.mark.parametrize("kind", ["set", "big", "surrogate", "key"])
async def test_an_unstorable_state_write_by_a_tool_is_reverted_and_reported(kind: str) -> None:
    agent = make_agent(
        [call("writes_state", "w", kind=kind), "done"], checkpointing=False, tools=[writes_state]
    )
    before = {"good": "old", "set": "old", "big": "old", "surrogate": "old"}
    out = await invoke(agent, new_state(before), "go")
    assert out.stop == "end_turn"
    expected = dict(before, good="new")
    assert out.state.agent_state == expected, "only the unstorable write is undone"
    assert out.result.state == expected
    [result] = results_of(out.state.messages[2])
    assert result["status"] == "error"
    first, second = result["content"]
    assert first["text"].startswith("Error: agent state written by the tool could not be stored")
    assert second == {"text": "wrote"}, "what the tool reported stays visible"
    stores(out.state)
    orjson.dumps(out.result.to_dict())


async def test_an_unstorable_write_with_no_earlier_value_is_dropped() -> None:
    agent = make_agent(
        [call("writes_state", "w", kind="set"), "done"], checkpointing=False, tools=[writes_state]
    )
    out = await invoke(agent, new_state(), "go")
    assert out.state.agent_state == {"good": "new"}
    stores(out.state)


async def test_unstorable_state_writes_by_hooks_are_reverted() -> None:
    class Writes(HookProvider):
        def register_hooks(self, registry: HookRegistry) -> None:
            registry.add_callback(BeforeInvocationEvent, self.before)
            registry.add_callback(AfterInvocationEvent, self.after)

        def before(self, event: BeforeInvocationEvent) -> None:
            event.agent_state["seen"] = object()
            event.agent_state["kept"] = 1

        def after(self, event: AfterInvocationEvent) -> None:
            event.result.state["kept"] = 2**70
            event.result.state["when"] = datetime.date(2024, 5, 1)

    agent = make_agent(["done"], checkpointing=False, hooks=[Writes()])
    out = await invoke(agent, new_state({"seen": "before"}), "go")
    assert out.stop == "end_turn"
    expected = {"seen": "before", "kept": 1, "when": "2024-05-01"}
    assert out.state.agent_state == expected
    assert out.result.state == expected
    stores(out.state)
    orjson.dumps(out.result.to_dict())


def test_the_guard_accepts_exactly_what_the_session_codec_encodes() -> None:
    # Same encoder, same options: whatever stored_form accepts, the codec stores, and back.
    for value in [{"a": [1, 2.5, None, True]}, {"big": 2**64 - 1}, {"when": datetime.date.today()}]:
        state = new_state(stored_form(value))
        assert roundtrip(state) == state
    for value in [{"a": {1}}, {"big": 2**64}, {1: "x"}, {"s": "\ud800"}]:
        with pytest.raises(UnstorableError):
            stored_form(value)
        with pytest.raises(TypeError):
            encode_state(new_state(value))


def test_a_state_given_unstorable_is_repaired_against_an_empty_one() -> None:
    state: dict[Any, Any] = {"ok": 1, "bad": {1}, 3: "x"}
    guard = StateGuard(state)
    assert state == {"ok": 1}
    assert guard.check() is None
