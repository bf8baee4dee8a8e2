"""Wire shapes pinned as literals: what the reference SDK produces for the same scenarios.

Every expected value here was observed by running the same scenario through the reference,
strands-agents 1.62.0 (``strands.Agent`` with a scripted model), except where SEMANTICS.md marks
a point [ours]; those tests say so. The reference's own per-message keys (``metadata``,
``tracking_id``) are not part of the message shape and are left out.
"""

from __future__ import annotations

from typing import Any

import pytest
from engine_helpers import answers, call, invoke, make_agent, resume, roundtrip

from service.agent.cancel import CancelSignal
from service.agent.errors import CheckpointIncompatibleError
from service.agent.events import ToolStarted
from service.agent.hooks import (
    AfterModelCallEvent,
    AfterToolCallEvent,
    AfterToolsEvent,
    BeforeToolCallEvent,
    BeforeToolsEvent,
    HookProvider,
    HookRegistry,
)
from service.agent.provider import ModelRequest
from service.agent.state import SessionState
from service.agent.tools import ToolContext, tool
from service.agent.types import STOP_REASONS, Checkpoint, Limits
from service.providers.scripted import ReplySpec, ScriptedModel


def new_state() -> SessionState:
    return SessionState(session_id="s-ref")


def reference_view(result: Any) -> dict[str, Any]:
    """The four fields the reference serializes, plus the interrupts it returns in memory."""
    data = result.to_dict()
    view = {key: data[key] for key in ("type", "message", "stop_reason", "checkpoint")}
    view["interrupts"] = data["interrupts"]
    return view


def user(*content: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(content)}


def assistant(*content: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": list(content)}


def use(tool_use_id: str, name: str, **input: Any) -> dict[str, Any]:
    return {"toolUse": {"toolUseId": tool_use_id, "name": name, "input": input}}


def ok(tool_use_id: str, text: str) -> dict[str, Any]:
    return {
        "toolResult": {"toolUseId": tool_use_id, "status": "success", "content": [{"text": text}]}
    }


def err(tool_use_id: str, text: str) -> dict[str, Any]:
    return {
        "toolResult": {"toolUseId": tool_use_id, "status": "error", "content": [{"text": text}]}
    }


@tool(inline=True)
def echo(text: str) -> str:
    """Echo."""
    return text


@tool(inline=True)
def add(a: int, b: int) -> int:
    """Add."""
    return a + b


@tool(inline=True)
def approve(action: str, context: ToolContext) -> str:
    """Approve."""
    answer = context.interrupt("approval", reason={"action": action})
    return f"{action}:{answer}"


@tool(inline=True)
def approve2(action: str, context: ToolContext) -> str:
    """Approve, second question."""
    answer = context.interrupt("approval2", reason={"action": action})
    return f"{action}:{answer}"


BASE = [echo, add, approve, approve2]

# --- results and checkpoints of a two-cycle turn --------------------------------------------

ECHO_MSG = assistant(use("e1", "echo", text="a"))
ADD_MSG = assistant(use("a1", "add", a=2, b=3))


async def test_two_cycle_turn_results_and_cycle_indexes() -> None:
    agent = make_agent(
        [call("echo", "e1", text="a"), call("add", "a1", a=2, b=3), "done"], tools=BASE
    )
    out = await invoke(agent, new_state(), "hi")
    views = [reference_view(out.result)]
    while out.stop == "checkpoint":
        out = await invoke(agent, out.state, resume(out))
        views.append(reference_view(out.result))

    def pause(message: dict[str, Any], position: str, index: int) -> dict[str, Any]:
        return {
            "type": "agent_result",
            "message": message,
            "stop_reason": "checkpoint",
            "checkpoint": {"position": position, "cycle_index": index, "schema_version": "1.0"},
            "interrupts": None,
        }

    assert views == [
        pause(ECHO_MSG, "after_model", 0),
        pause(ECHO_MSG, "after_tools", 0),
        pause(ADD_MSG, "after_model", 1),
        pause(ADD_MSG, "after_tools", 1),
        {
            "type": "agent_result",
            "message": assistant({"text": "done"}),
            "stop_reason": "end_turn",
            "checkpoint": None,
            "interrupts": None,
        },
    ]
    assert out.state.messages == [
        user({"text": "hi"}),
        ECHO_MSG,
        user(ok("e1", "a")),
        ADD_MSG,
        user(ok("a1", "5")),
        assistant({"text": "done"}),
    ]
    assert list(out.result.to_dict())[:4] == ["type", "message", "stop_reason", "checkpoint"]


def test_checkpoint_to_dict_and_from_dict_rules(caplog: pytest.LogCaptureFixture) -> None:
    assert Checkpoint("after_tools", 3).to_dict() == {
        "position": "after_tools",
        "cycle_index": 3,
        "schema_version": "1.0",
    }
    assert list(Checkpoint("after_model", 0).to_dict()) == [
        "position",
        "cycle_index",
        "schema_version",
    ]
    # The reference rejects a missing version, 1.0 as a number and "2.0".
    for version in (None, 1.0, "2.0"):
        data: dict[str, Any] = {"position": "after_model", "cycle_index": 0}
        if version is not None:
            data["schema_version"] = version
        with pytest.raises(CheckpointIncompatibleError):
            Checkpoint.from_dict(data)
    # Unknown keys are ignored with a warning.
    parsed = Checkpoint.from_dict(
        {"position": "after_model", "cycle_index": 2, "schema_version": "1.0", "extra": 1}
    )
    assert parsed == Checkpoint("after_model", 2)
    assert "extra" in caplog.text


def test_stop_reasons_are_the_reference_set_plus_error() -> None:
    reference = {
        "cancelled",
        "checkpoint",
        "content_filtered",
        "end_turn",
        "guardrail_intervened",
        "interrupt",
        "limit_output_tokens",
        "limit_total_tokens",
        "limit_turns",
        "max_tokens",
        "stop_sequence",
        "tool_use",
    }
    assert set(STOP_REASONS) == reference | {"error"}


# --- tool results -------------------------------------------------------------------------


@tool(inline=True)
def returns(kind: str) -> Any:
    """Return a value of the requested kind."""
    values: dict[str, Any] = {
        "dict": {"k": 1},
        "list": [1, "x"],
        "float": 2.5,
        "int": 5,
        "none": None,
        "bool": True,
        "unicode": {"k": "é", "n": [1.5, None]},
        "set": {1, 2},
        "status": {"status": "success", "content": [{"text": "raw"}]},
        "weird": {"status": "weird", "content": [{"json": {"a": 1}}]},
    }
    return values[kind]


@tool(inline=True)
def raises(kind: str) -> str:
    """Raise an exception of the requested kind."""
    if kind == "value":
        raise ValueError("bad value")
    if kind == "key":
        raise KeyError("k")
    raise RuntimeError("boom")


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("dict", ok("t", '{"k": 1}')),
        ("list", ok("t", '[1, "x"]')),
        ("float", ok("t", "2.5")),
        ("int", ok("t", "5")),
        ("none", ok("t", "null")),
        ("bool", ok("t", "true")),
        ("unicode", ok("t", '{"k": "é", "n": [1.5, null]}')),
        ("set", ok("t", "{1, 2}")),
        (
            "status",
            {"toolResult": {"status": "success", "content": [{"text": "raw"}], "toolUseId": "t"}},
        ),
        # A dict with status and content is taken as-is (toolUseId last) once it has the
        # toolResult shape; an odd status makes it the tool's error result instead.
        (
            "weird",
            err(
                "t",
                "Error: the tool's result could not be stored: "
                "status must be 'success' or 'error', not 'weird'",
            ),
        ),
    ],
)
async def test_return_values_become_the_reference_result_blocks(kind: str, expected: Any) -> None:
    agent = make_agent(
        [call("returns", "t", kind=kind), "ok"], checkpointing=False, tools=[returns]
    )
    out = await invoke(agent, new_state(), "go")
    assert out.state.messages[2] == user(expected)
    assert list(out.state.messages[2]["content"][0]["toolResult"]) == list(expected["toolResult"])


async def test_exceptions_unknown_tools_and_bad_input_become_reference_errors() -> None:
    script = [
        [
            call("raises", "t5", kind="value"),
            call("raises", "t6", kind="key"),
            call("raises", "t7", kind="runtime"),
            call("missing", "t10"),
            call("add", "t11", a="x", b=1),
        ],
        "ok",
    ]
    agent = make_agent(script, checkpointing=False, tools=[raises, add])
    out = await invoke(agent, new_state(), "go")
    blocks = out.state.messages[2]["content"]
    assert blocks[:4] == [
        err("t5", "Error: bad value"),
        err("t6", "Error: KeyError - 'k'"),
        err("t7", "Error: RuntimeError - boom"),
        err("t10", "Unknown tool: missing"),
    ]
    text = blocks[4]["toolResult"]["content"][0]["text"]
    assert blocks[4]["toolResult"]["status"] == "error"
    assert text.startswith(
        "Error: Validation failed for input parameters: 1 validation error for AddTool\na\n"
    ), text


# --- interrupts -------------------------------------------------------------------------

APPROVAL_ID = "v1:tool_call:ap:225d3982-9eb3-5ce9-93ca-f09a444307f7"


@pytest.mark.parametrize("executor", ["sequential", "concurrent"])
async def test_tool_interrupt_shape_and_answer(executor: str) -> None:
    batch = [
        call("echo", "e1", text="a"),
        call("approve", "ap", action="ship"),
        call("echo", "e2", text="b"),
    ]
    agent = make_agent([batch, "done"], checkpointing=False, tools=BASE, executor=executor)
    out = await invoke(agent, new_state(), "go")
    tool_use_message = assistant(
        use("e1", "echo", text="a"),
        use("ap", "approve", action="ship"),
        use("e2", "echo", text="b"),
    )
    assert reference_view(out.result) == {
        "type": "agent_result",
        "message": tool_use_message,
        "stop_reason": "interrupt",
        "checkpoint": None,
        "interrupts": [
            {"id": APPROVAL_ID, "name": "approval", "reason": {"action": "ship"}, "response": None}
        ],
    }
    out = await invoke(
        agent, out.state, [{"interruptResponse": {"interruptId": APPROVAL_ID, "response": "yes"}}]
    )
    assert out.stop == "end_turn"
    # [ours] toolUse order for both executors; the reference's concurrent executor puts the
    # already-completed results first.
    assert out.state.messages[2] == user(ok("e1", "a"), ok("ap", "ship:yes"), ok("e2", "b"))


async def test_interrupt_under_checkpointing_pauses_after_tools_once_answered() -> None:
    script = [
        [call("echo", "e1", text="a"), call("approve", "ap", action="ship")],
        call("echo", "e3", text="c"),
        "done",
    ]
    agent = make_agent(script, tools=BASE)
    out = await invoke(agent, new_state(), "go")
    seen = [(out.stop, out.checkpoint)]
    out = await invoke(agent, out.state, resume(out))
    seen.append((out.stop, out.checkpoint))
    assert [i.id for i in out.result.interrupts or []] == [APPROVAL_ID]
    out = await invoke(agent, out.state, answers((APPROVAL_ID, "yes")))
    seen.append((out.stop, out.checkpoint))
    while out.stop == "checkpoint":
        out = await invoke(agent, out.state, resume(out))
        seen.append((out.stop, out.checkpoint))

    def at(position: str, index: int) -> dict[str, Any]:
        return {"position": position, "cycle_index": index, "schema_version": "1.0"}

    assert seen == [
        ("checkpoint", at("after_model", 0)),
        ("interrupt", None),
        ("checkpoint", at("after_tools", 0)),
        ("checkpoint", at("after_model", 1)),
        ("checkpoint", at("after_tools", 1)),
        ("end_turn", None),
    ]


async def test_null_answer_interrupts_again_and_concurrent_partial_answer() -> None:
    agent = make_agent(
        [call("approve", "ap", action="ship"), "done"], checkpointing=False, tools=BASE
    )
    out = await invoke(agent, new_state(), "go")
    out = await invoke(agent, out.state, answers((APPROVAL_ID, None)))
    assert reference_view(out.result)["interrupts"] == [
        {"id": APPROVAL_ID, "name": "approval", "reason": {"action": "ship"}, "response": None}
    ]
    out = await invoke(agent, out.state, answers((APPROVAL_ID, "ok")))
    assert out.state.messages[2] == user(ok("ap", "ship:ok"))

    second_id = "v1:tool_call:p2:fa98397e-df84-5381-8788-020017b5c531"
    first_id = "v1:tool_call:p1:225d3982-9eb3-5ce9-93ca-f09a444307f7"
    batch = [call("approve", "p1", action="x"), call("approve2", "p2", action="y")]
    agent = make_agent([batch, "done"], checkpointing=False, tools=BASE, executor="concurrent")
    out = await invoke(agent, new_state(), "go")
    assert [i.id for i in out.result.interrupts or []] == [first_id, second_id]
    out = await invoke(agent, out.state, answers((first_id, "ok")))
    assert reference_view(out.result)["interrupts"] == [
        {"id": second_id, "name": "approval2", "reason": {"action": "y"}, "response": None}
    ]
    out = await invoke(agent, out.state, answers((second_id, "ok2")))
    assert out.state.messages[2] == user(ok("p1", "x:ok"), ok("p2", "y:ok2"))


class Gate(HookProvider):
    def register_hooks(self, registry: HookRegistry) -> None:
        registry.add_callback(BeforeToolCallEvent, self.before_call)

    def before_call(self, event: BeforeToolCallEvent) -> None:
        if event.interrupt("gate", reason="why") == "deny":
            event.cancel_tool = "denied by gate"


class Batch(HookProvider):
    def register_hooks(self, registry: HookRegistry) -> None:
        registry.add_callback(BeforeToolsEvent, self.before_tools)

    def before_tools(self, event: BeforeToolsEvent) -> None:
        event.interrupt("batch")


async def test_hook_interrupt_ids_and_skip_result() -> None:
    gate_id = "v1:before_tool_call:e1:a9bb0ac7-7af2-5477-bcbf-e70bf970ffa3"
    agent = make_agent(
        [call("echo", "e1", text="a"), "done"], checkpointing=False, tools=BASE, hooks=[Gate()]
    )
    out = await invoke(agent, new_state(), "go")
    assert reference_view(out.result)["interrupts"] == [
        {"id": gate_id, "name": "gate", "reason": "why", "response": None}
    ]
    out = await invoke(agent, out.state, answers((gate_id, "deny")))
    assert out.state.messages[2] == user(err("e1", "denied by gate"))

    batch_id = "v1:before_tools:225782ff-faeb-5e16-a39a-2dd54ed6cd85"
    agent = make_agent(
        [call("echo", "e1", text="a"), "done"], checkpointing=False, tools=BASE, hooks=[Batch()]
    )
    out = await invoke(agent, new_state(), "go")
    assert reference_view(out.result)["interrupts"] == [
        {"id": batch_id, "name": "batch", "reason": None, "response": None}
    ]
    out = await invoke(agent, out.state, answers((batch_id, "ok")))
    assert out.stop == "end_turn"
    assert out.state.messages[2] == user(ok("e1", "a"))


# --- synthetic results and cancel -------------------------------------------------------------


async def test_new_prompt_abandons_the_batch_with_tool_was_interrupted() -> None:
    agent = make_agent(
        [[call("echo", "e1", text="a"), call("echo", "e2", text="b")], "fresh"], tools=BASE
    )
    out = await invoke(agent, new_state(), "go")
    out = await invoke(agent, out.state, "new prompt")
    # [ours] the prompt joins the synthetic results' user message (the reference adds a second
    # user message); the result blocks themselves are the reference's.
    assert out.state.messages[2] == user(
        err("e1", "Tool was interrupted."),
        err("e2", "Tool was interrupted."),
        {"text": "new prompt"},
    )


class CancelAfterModel(HookProvider):
    def __init__(self, signal: CancelSignal, message: str | None) -> None:
        self.signal, self.message = signal, message

    def register_hooks(self, registry: HookRegistry) -> None:
        registry.add_callback(AfterModelCallEvent, self.after_model)

    def after_model(self, event: AfterModelCallEvent) -> None:
        if event.reply is not None and event.reply.stop_reason == "tool_use":
            self.signal.cancel(self.message)


@pytest.mark.parametrize("checkpointing", [False, True])
async def test_cancel_after_model_without_message_keeps_the_tool_use_message(
    checkpointing: bool,
) -> None:
    signal = CancelSignal()
    batch = [call("echo", "e1", text="a"), call("echo", "e2", text="b")]
    agent = make_agent(
        [batch, "never"],
        checkpointing=checkpointing,
        tools=BASE,
        hooks=[CancelAfterModel(signal, None)],
    )
    out = await invoke(agent, new_state(), "go", cancel=signal)
    tool_use_message = assistant(use("e1", "echo", text="a"), use("e2", "echo", text="b"))
    assert reference_view(out.result) == {
        "type": "agent_result",
        "message": tool_use_message,
        "stop_reason": "cancelled",
        "checkpoint": None,
        "interrupts": None,
    }
    assert out.state.messages == [
        user({"text": "go"}),
        tool_use_message,
        user(err("e1", "Tool execution cancelled"), err("e2", "Tool execution cancelled")),
    ]


async def test_cancel_after_model_with_message_appends_it() -> None:
    signal = CancelSignal()
    agent = make_agent(
        [call("echo", "e1", text="a"), "never"],
        checkpointing=False,
        tools=BASE,
        hooks=[CancelAfterModel(signal, "halt")],
    )
    out = await invoke(agent, new_state(), "go", cancel=signal)
    assert out.result.message == assistant({"text": "halt"})
    assert out.state.messages[2:] == [
        user(err("e1", "Tool execution cancelled")),
        assistant({"text": "halt"}),
    ]


def cancelling_model(
    script: list[ReplySpec], *, deferred: bool, message: str | None = None
) -> ScriptedModel:
    """A model that sets the invocation's cancel as its stream opens (the reference's on-call)."""

    def responder(request: ModelRequest, index: int) -> ReplySpec:
        request.cancel.cancel(message, after_current_tools=deferred)
        return script[index]

    return ScriptedModel(responder)


@pytest.mark.parametrize(("message", "text"), [(None, "Cancelled by user"), ("halt", "halt")])
async def test_cancel_during_the_stream_replaces_the_reply(message: str | None, text: str) -> None:
    agent = make_agent(["hello"], checkpointing=False, tools=BASE)
    agent.model = cancelling_model(["hello"], deferred=False, message=message)
    out = await invoke(agent, new_state(), "go", cancel=CancelSignal())
    assert reference_view(out.result)["message"] == assistant({"text": text})
    assert out.stop == "cancelled"
    assert out.state.messages == [user({"text": "go"}), assistant({"text": text})]


async def test_deferred_cancel_during_the_stream() -> None:
    # No tools in the reply: the deferred cancel never applies and the turn ends normally.
    agent = make_agent(["hello"], checkpointing=False, tools=BASE)
    agent.model = cancelling_model(["hello"], deferred=True)
    out = await invoke(agent, new_state(), "go", cancel=CancelSignal())
    assert (out.stop, out.result.message) == ("end_turn", assistant({"text": "hello"}))
    # With tools: no batch was running, so none starts; the reply is kept, its tools cancelled.
    agent = make_agent(["unused"], checkpointing=False, tools=BASE)
    agent.model = cancelling_model([call("echo", "e1", text="a"), "never"], deferred=True)
    out = await invoke(agent, new_state(), "go", cancel=CancelSignal())
    assert reference_view(out.result) == {
        "type": "agent_result",
        "message": ECHO_MSG,
        "stop_reason": "cancelled",
        "checkpoint": None,
        "interrupts": None,
    }
    assert out.state.messages == [
        user({"text": "go"}),
        ECHO_MSG,
        user(err("e1", "Tool execution cancelled")),
    ]


@tool(inline=True)
def stopper(text: str, mode: str, context: ToolContext) -> str:
    """Cancel the invocation from inside a tool."""
    message = "halt" if mode.endswith("msg") else None
    context.cancel.cancel(message, after_current_tools=mode.startswith("deferred"))
    return f"stopped:{text}"


@pytest.mark.parametrize(
    ("mode", "second", "tail"),
    [
        ("now", err("e2", "Tool execution cancelled"), []),
        ("now_msg", err("e2", "Tool execution cancelled"), [assistant({"text": "halt"})]),
        ("deferred", ok("e2", "b"), []),
        ("deferred_msg", ok("e2", "b"), [assistant({"text": "halt"})]),
    ],
)
async def test_cancel_from_inside_a_tool(
    mode: str, second: dict[str, Any], tail: list[dict[str, Any]]
) -> None:
    batch = [call("stopper", "s1", text="a", mode=mode), call("echo", "e2", text="b")]
    agent = make_agent([batch, "never"], checkpointing=False, tools=[stopper, echo])
    out = await invoke(agent, new_state(), "go", cancel=CancelSignal())
    tool_use_message = assistant(
        use("s1", "stopper", text="a", mode=mode), use("e2", "echo", text="b")
    )
    assert out.stop == "cancelled"
    assert out.result.message == (tail[0] if tail else tool_use_message)
    assert out.state.messages == [
        user({"text": "go"}),
        tool_use_message,
        user(ok("s1", "stopped:a"), second),
        *tail,
    ]


async def test_cancel_at_a_resume_from_after_model() -> None:
    agent = make_agent([call("echo", "e1", text="a"), "never"], tools=BASE)
    paused = await invoke(agent, new_state(), "go")
    immediate = CancelSignal()
    immediate.cancel()
    out = await invoke(agent, paused.state, resume(paused), cancel=immediate)
    assert (out.stop, out.result.message) == ("cancelled", ECHO_MSG)
    assert out.state.messages[2:] == [user(err("e1", "Tool execution cancelled"))]
    # A deferred cancel seen while no batch runs stops before the pending one starts as well.
    deferred = CancelSignal()
    deferred.cancel(after_current_tools=True)
    out = await invoke(agent, paused.state, resume(paused), cancel=deferred)
    assert (out.stop, out.result.message) == ("cancelled", ECHO_MSG)
    assert out.state.messages[2:] == [user(err("e1", "Tool execution cancelled"))]


# --- limits -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limits", "stop", "calls"),
    [
        (Limits(max_cycles=1), "limit_turns", 1),
        (Limits(max_cycles=2), "limit_turns", 2),
        (Limits(max_tokens=2), "limit_total_tokens", 1),
    ],
)
async def test_limit_results_carry_the_last_message(limits: Limits, stop: str, calls: int) -> None:
    script = [call("echo", "e1", text="a"), call("echo", "e2", text="b"), "done"]
    agent = make_agent(script, checkpointing=False, tools=BASE, limits=limits)
    out = await invoke(agent, new_state(), "go")
    last = user(ok("e1", "a")) if calls == 1 else user(ok("e2", "b"))
    assert reference_view(out.result) == {
        "type": "agent_result",
        "message": last,
        "stop_reason": stop,
        "checkpoint": None,
        "interrupts": None,
    }
    assert out.state.messages[-1] == last
    assert len([m for m in out.state.messages if m["role"] == "assistant"]) == calls


class Skip(HookProvider):
    def __init__(self) -> None:
        self.after: list[tuple[str, str | None]] = []

    def register_hooks(self, registry: HookRegistry) -> None:
        registry.add_callback(BeforeToolCallEvent, self.before_call)
        registry.add_callback(AfterToolCallEvent, self.after_call)

    def before_call(self, event: BeforeToolCallEvent) -> None:
        event.cancel_tool = {"e1": True, "e2": "custom", "e3": ""}[event.tool_use["toolUseId"]]

    def after_call(self, event: AfterToolCallEvent) -> None:
        self.after.append((event.tool_use["toolUseId"], event.cancel_message))
        if event.tool_use["toolUseId"] == "e2":
            event.result = err("e2", "custom, then replaced")


async def test_cancel_tool_from_a_hook() -> None:
    batch = [
        call("echo", "e1", text="a"),
        call("echo", "e2", text="b"),
        call("echo", "e3", text="c"),
    ]
    skip = Skip()
    agent = make_agent([batch, "ok"], checkpointing=False, tools=BASE, hooks=[skip])
    out = await invoke(agent, new_state(), "go")
    # True gives the reference's default text; an empty string does not skip the tool. The
    # after-tool-call hooks see a skipped tool too, with the skip's text, and may replace it.
    assert out.state.messages[2] == user(
        err("e1", "tool cancelled by user"), err("e2", "custom, then replaced"), ok("e3", "c")
    )
    assert skip.after == [("e1", "tool cancelled by user"), ("e2", "custom"), ("e3", None)]


@pytest.mark.parametrize("mode", ["now", "deferred"])
async def test_cancel_inside_a_tool_beats_the_after_tools_checkpoint(mode: str) -> None:
    batch = [call("stopper", "s1", text="a", mode=mode), call("echo", "e2", text="b")]
    agent = make_agent([batch, "never"], tools=[stopper, echo])
    paused = await invoke(agent, new_state(), "go")
    out = await invoke(agent, paused.state, resume(paused), cancel=CancelSignal())
    second = ok("e2", "b") if mode == "deferred" else err("e2", "Tool execution cancelled")
    assert reference_view(out.result) == {
        "type": "agent_result",
        "message": paused.result.message,
        "stop_reason": "cancelled",
        "checkpoint": None,
        "interrupts": None,
    }
    assert out.state.messages[2:] == [user(ok("s1", "stopped:a"), second)]


# --- tool names no tool can have --------------------------------------------------------------

BAD = "Error: tool_name=<bad name!> | invalid tool name pattern"
LONG = "a" * 70
TOO_LONG = f"Error: tool_name=<{LONG}>, tool_name_max_length=<64> | invalid tool name length"
GATE_E1 = "v1:before_tool_call:e1:a9bb0ac7-7af2-5477-bcbf-e70bf970ffa3"


class Recorder(HookProvider):
    """Records the toolUseIds each tool-call hook saw and the after-tools results."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.after_tools: list[list[dict[str, Any]]] = []

    def register_hooks(self, registry: HookRegistry) -> None:
        registry.add_callback(BeforeToolCallEvent, self.before_call)
        registry.add_callback(AfterToolCallEvent, self.after_call)
        registry.add_callback(AfterToolsEvent, self.after_batch)

    def before_call(self, event: BeforeToolCallEvent) -> None:
        self.calls.append(f"before {event.tool_use['toolUseId']}")

    def after_call(self, event: AfterToolCallEvent) -> None:
        self.calls.append(f"after {event.tool_use['toolUseId']}")

    def after_batch(self, event: AfterToolsEvent) -> None:
        self.after_tools.append(list(event.results))


@pytest.mark.parametrize("executor", ["sequential", "concurrent"])
async def test_invalid_names_get_the_name_error_first_and_unknown_valid_names_stay_in_place(
    executor: str,
) -> None:
    batch = [
        call("echo", "e0", text="first"),
        call("nosuch", "u1"),
        call("bad name!", "x1", q=1),
        call("echo", "e2", text="z"),
        call(LONG, "x3"),
    ]
    recorder = Recorder()
    agent = make_agent(
        [batch, "done"], checkpointing=False, tools=BASE, executor=executor, hooks=[recorder]
    )
    out = await invoke(agent, new_state(), "hi")
    assert out.stop == "end_turn"
    results = user(
        err("x1", BAD),
        err("x3", TOO_LONG),
        ok("e0", "first"),
        err("u1", "Unknown tool: nosuch"),
        ok("e2", "z"),
    )
    assert out.state.messages[2] == results
    assert recorder.after_tools == [results["content"]]
    # Never a tool call: no hooks, no started event, no tool metrics.
    assert {c.split()[1] for c in recorder.calls} == {"e0", "u1", "e2"}
    assert {e.tool_use_id for e in out.of(ToolStarted)} == {"e0", "u1", "e2"}
    assert set(out.result.metrics["invocation"]["tools"]) == {"echo", "nosuch"}


async def test_a_name_may_end_in_one_newline_which_counts_toward_the_length() -> None:
    name64 = "a" * 64
    batch = [
        call("echo\n", "n1", text="a"),
        call(name64 + "\n", "n2"),
        call(name64, "n3"),
        call("echo\n\n", "n4"),
        call("", "n5"),
    ]
    agent = make_agent([batch, "done"], checkpointing=False, tools=BASE)
    out = await invoke(agent, new_state(), "hi")
    assert out.state.messages[2] == user(
        err(
            "n2",
            f"Error: tool_name=<{name64}\n>, tool_name_max_length=<64> | invalid tool name length",
        ),
        err("n4", "Error: tool_name=<echo\n\n> | invalid tool name pattern"),
        err("n5", "Error: tool_name=<> | invalid tool name pattern"),
        err("n1", "Unknown tool: echo\n"),
        err("n3", f"Unknown tool: {name64}"),
    )


async def test_a_tool_use_without_a_name_is_answered_as_missing_its_name() -> None:
    reply = assistant({"toolUse": {"toolUseId": "m1", "input": {}}}, use("e1", "echo", text="a"))
    agent = make_agent([reply, "done"], checkpointing=False, tools=BASE)
    out = await invoke(agent, new_state(), "hi")
    assert out.state.messages[2] == user(err("m1", "Error: tool name missing"), ok("e1", "a"))


async def test_an_invalid_name_is_never_gated_and_its_result_stays_first_after_the_answer() -> None:
    batch = [call("echo", "e1", text="a"), call("bad name!", "x1")]
    agent = make_agent([batch, "done"], checkpointing=False, tools=BASE, hooks=[Gate()])
    out = await invoke(agent, new_state(), "go")
    assert [i["id"] for i in reference_view(out.result)["interrupts"]] == [GATE_E1]
    out = await invoke(agent, roundtrip(out.state), answers((GATE_E1, "ok")))
    assert out.stop == "end_turn"
    assert out.state.messages[2] == user(err("x1", BAD), ok("e1", "a"))


@pytest.mark.parametrize("executor", ["sequential", "concurrent"])
async def test_after_a_tool_interrupt_the_name_errors_still_come_first(executor: str) -> None:
    batch = [
        call("echo", "e0", text="a"),
        call("approve", "ap", action="ship"),
        call("bad name!", "x1"),
        call("echo", "e2", text="b"),
    ]
    agent = make_agent([batch, "done"], checkpointing=False, tools=BASE, executor=executor)
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "interrupt"
    out = await invoke(agent, roundtrip(out.state), answers((APPROVAL_ID, "yes")))
    assert out.stop == "end_turn"
    # [ours] after the name errors, toolUse order (the reference puts the results completed
    # before the interrupt next).
    assert out.state.messages[2] == user(
        err("x1", BAD), ok("e0", "a"), ok("ap", "ship:yes"), ok("e2", "b")
    )


async def test_the_name_errors_come_first_at_a_resume_from_after_model_and_after_a_batch_hook() -> (
    None
):
    batch = [call("echo", "e1", text="a"), call("bad name!", "x1")]
    agent = make_agent([batch, "done"], tools=BASE)
    out = await invoke(agent, new_state(), "go")
    assert out.checkpoint == {"position": "after_model", "cycle_index": 0, "schema_version": "1.0"}
    out = await invoke(agent, roundtrip(out.state), resume(out))
    assert out.state.messages[2] == user(err("x1", BAD), ok("e1", "a"))

    batch_id = "v1:before_tools:225782ff-faeb-5e16-a39a-2dd54ed6cd85"
    agent = make_agent([batch, "done"], checkpointing=False, tools=BASE, hooks=[Batch()])
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "interrupt"
    out = await invoke(agent, roundtrip(out.state), answers((batch_id, "ok")))
    assert out.state.messages[2] == user(err("x1", BAD), ok("e1", "a"))


async def test_a_batch_that_never_started_keeps_tool_use_order() -> None:
    signal = CancelSignal()
    batch = [call("echo", "e1", text="a"), call("bad name!", "x1")]
    agent = make_agent(
        [batch, "never"],
        checkpointing=False,
        tools=BASE,
        hooks=[CancelAfterModel(signal, None)],
    )
    out = await invoke(agent, new_state(), "go", cancel=signal)
    assert out.state.messages[2] == user(
        err("e1", "Tool execution cancelled"), err("x1", "Tool execution cancelled")
    )

    agent = make_agent([batch, "fresh"], tools=BASE)
    out = await invoke(agent, new_state(), "go")
    out = await invoke(agent, out.state, "new prompt")
    assert out.state.messages[2] == user(
        err("e1", "Tool was interrupted."),
        err("x1", "Tool was interrupted."),
        {"text": "new prompt"},
    )


async def test_a_cancel_inside_the_batch_leaves_the_name_errors_first() -> None:
    batch = [
        call("echo", "e0", text="a"),
        call("stopper", "s1", text="b", mode="now"),
        call("echo", "e2", text="c"),
        call("bad name!", "x1"),
    ]
    agent = make_agent([batch, "never"], checkpointing=False, tools=[stopper, echo])
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "cancelled"
    assert out.state.messages[2] == user(
        err("x1", BAD), ok("e0", "a"), ok("s1", "stopped:b"), err("e2", "Tool execution cancelled")
    )


# --- input that is not an object ------------------------------------------------------------


@tool(inline=True)
def noargs() -> str:
    """No arguments."""
    return "ok"


def not_a_mapping(model: str, kind: str) -> str:
    return (
        f"Error: Validation failed for input parameters: strands.tools.decorator.{model}()"
        f" argument after ** must be a mapping, not {kind}"
    )


@pytest.mark.parametrize(
    ("value", "kind"),
    [(None, "NoneType"), ([1], "list"), ("s", "str"), ([], "list"), ("", "str"), (0, "int")],
)
async def test_input_that_is_not_an_object_is_refused(value: Any, kind: str) -> None:
    reply = assistant(
        {"toolUse": {"toolUseId": "l1", "name": "echo", "input": value}},
        {"toolUse": {"toolUseId": "l2", "name": "noargs", "input": value}},
    )
    agent = make_agent([reply, "done"], checkpointing=False, tools=[echo, noargs])
    out = await invoke(agent, new_state(), "hi")
    assert out.state.messages[2] == user(
        err("l1", not_a_mapping("EchoTool", kind)), err("l2", not_a_mapping("NoargsTool", kind))
    )


async def test_a_tool_use_without_input_runs_with_no_arguments() -> None:
    reply = assistant({"toolUse": {"toolUseId": "l1", "name": "noargs"}})
    agent = make_agent([reply, "done"], checkpointing=False, tools=[noargs])
    out = await invoke(agent, new_state(), "hi")
    assert out.state.messages[2] == user(ok("l1", "ok"))
