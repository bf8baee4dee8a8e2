"""Hook events (SEMANTICS §7): which fire, in what order; validation failures fire none."""

from __future__ import annotations

from typing import Any

import pytest
from engine_helpers import call, check_history, echo, invoke, make_agent, results_of, resume

from service.agent.cancel import CancelSignal
from service.agent.errors import CheckpointStaleError
from service.agent.hooks import (
    AfterInvocationEvent,
    AfterModelCallEvent,
    AfterToolCallEvent,
    AfterToolsEvent,
    BeforeInvocationEvent,
    BeforeModelCallEvent,
    BeforeToolCallEvent,
    BeforeToolsEvent,
    HookEvent,
    HookProvider,
    HookRegistry,
    MessageAddedEvent,
)
from service.agent.state import SessionState
from service.agent.tools import tool
from service.providers.scripted import ScriptedReply

ALL_EVENTS: list[type[HookEvent]] = [
    BeforeInvocationEvent,
    AfterInvocationEvent,
    MessageAddedEvent,
    BeforeModelCallEvent,
    AfterModelCallEvent,
    BeforeToolsEvent,
    AfterToolsEvent,
    BeforeToolCallEvent,
    AfterToolCallEvent,
]


class Recorder(HookProvider):
    def __init__(self, tag: str = "") -> None:
        self.tag = tag
        self.seen: list[str] = []
        self.added: list[dict[str, Any]] = []

    def register_hooks(self, registry: HookRegistry) -> None:
        for event_type in ALL_EVENTS:
            registry.add_callback(event_type, self.on)

    async def on(self, event: HookEvent) -> None:
        name = type(event).__name__.removesuffix("Event")
        if isinstance(event, MessageAddedEvent):
            name += f":{event.message['role']}"
            self.added.append(event.message)
        self.seen.append(self.tag + name)


def new_state() -> SessionState:
    return SessionState(session_id="s-hooks")


async def test_hook_order_for_one_tool_cycle() -> None:
    recorder = Recorder()
    agent = make_agent([call("echo", text="a"), "done"], checkpointing=False, hooks=[recorder])
    await invoke(agent, new_state(), "go")
    assert recorder.seen == [
        "BeforeInvocation",
        "MessageAdded:user",
        "BeforeModelCall",
        "AfterModelCall",
        "MessageAdded:assistant",
        "BeforeTools",
        "BeforeToolCall",
        "AfterToolCall",
        "AfterTools",
        "MessageAdded:user",
        "BeforeModelCall",
        "AfterModelCall",
        "MessageAdded:assistant",
        "AfterInvocation",
    ]


async def test_invocation_hooks_fire_on_every_resume_with_the_new_input_only() -> None:
    inputs: list[object] = []

    class Inputs(HookProvider):
        def register_hooks(self, registry: HookRegistry) -> None:
            registry.add_callback(BeforeInvocationEvent, lambda e: inputs.append(e.input))

    recorder = Recorder()
    agent = make_agent([call("echo", text="a"), "done"], hooks=[recorder, Inputs()])
    out = await invoke(agent, new_state(), "go")
    out = await invoke(agent, out.state, resume(out))
    assert recorder.seen.count("BeforeInvocation") == 2
    assert recorder.seen.count("AfterInvocation") == 2
    assert inputs == [
        "go",
        resume({"position": "after_model", "cycle_index": 0, "schema_version": "1.0"}),
    ]


async def test_after_callbacks_run_in_reverse_registration_order() -> None:
    first, second = Recorder("1:"), Recorder("2:")
    shared: list[str] = []
    first.seen = second.seen = shared
    agent = make_agent(["done"], checkpointing=False, hooks=[first, second])
    await invoke(agent, new_state(), "go")
    assert shared[:2] == ["1:BeforeInvocation", "2:BeforeInvocation"]
    assert shared[-2:] == ["2:AfterInvocation", "1:AfterInvocation"]


async def test_validation_failure_fires_no_hook() -> None:
    recorder = Recorder()
    agent = make_agent([call("echo", text="a"), "done"], hooks=[recorder])
    out = await invoke(agent, new_state(), "go")
    recorder.seen.clear()
    with pytest.raises(CheckpointStaleError):
        await invoke(
            agent,
            out.state,
            resume({"position": "after_tools", "cycle_index": 0, "schema_version": "1.0"}),
        )
    assert recorder.seen == []


async def test_after_tool_call_may_replace_the_result() -> None:
    class Redact(HookProvider):
        def register_hooks(self, registry: HookRegistry) -> None:
            registry.add_callback(AfterToolCallEvent, self.redact)

        def redact(self, event: AfterToolCallEvent) -> None:
            event.result = {
                "toolResult": {
                    "toolUseId": event.tool_use["toolUseId"],
                    "status": "success",
                    "content": [{"text": "[redacted]"}],
                }
            }

    agent = make_agent(
        [call("echo", "e", text="secret"), "done"], checkpointing=False, hooks=[Redact()]
    )
    out = await invoke(agent, new_state(), "go")
    assert out.state.messages[2]["content"][0]["toolResult"]["content"] == [{"text": "[redacted]"}]


async def test_model_hooks_see_request_and_reply() -> None:
    seen: list[object] = []

    class Model(HookProvider):
        def register_hooks(self, registry: HookRegistry) -> None:
            registry.add_callback(
                BeforeModelCallEvent, lambda e: seen.append(len(e.request.messages))
            )
            registry.add_callback(
                AfterModelCallEvent, lambda e: seen.append(e.reply.stop_reason if e.reply else None)
            )

    agent = make_agent(["done"], checkpointing=False, hooks=[Model()])
    await invoke(agent, new_state(), "go")
    assert seen == [1, "end_turn"]


class Batches(HookProvider):
    """Records the before-tools and after-tools events (with the results) of every batch."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, list[tuple[str, str]]]] = []

    def register_hooks(self, registry: HookRegistry) -> None:
        registry.add_callback(BeforeToolsEvent, lambda e: self.seen.append(("before", [])))
        registry.add_callback(AfterToolsEvent, self.after)

    def after(self, event: AfterToolsEvent) -> None:
        results = [
            (b["toolResult"]["toolUseId"], b["toolResult"]["content"][0]["text"])
            for b in event.results
        ]
        self.seen.append(("after", results))


CANCEL: dict[str, CancelSignal] = {}


@tool(inline=True)
def stops(text: str) -> str:
    """Cancel the running invocation at once, then finish normally."""
    CANCEL["current"].cancel()
    return text


async def test_a_cancel_before_the_batch_still_fires_the_batch_hooks() -> None:
    batches = Batches()
    script = [[call("echo", "a", text="x"), call("echo", "b", text="y")], "never"]
    agent = make_agent(script, hooks=[batches])
    cancel = CancelSignal()
    original = agent.model.stream

    async def stream_then_cancel(request: Any) -> Any:
        async for chunk in original(request):
            yield chunk
        cancel.cancel()

    agent.model.stream = stream_then_cancel  # type: ignore[method-assign]
    out = await invoke(agent, new_state(), "go", cancel=cancel)
    assert out.stop == "cancelled"
    cancelled = "Tool execution cancelled"
    assert batches.seen == [("before", []), ("after", [("a", cancelled), ("b", cancelled)])]
    assert [r["toolResult"] for r in out.state.messages[2]["content"]] == [
        {"toolUseId": "a", "status": "error", "content": [{"text": cancelled}]},
        {"toolUseId": "b", "status": "error", "content": [{"text": cancelled}]},
    ]


async def test_a_cancel_midway_puts_the_synthetic_results_in_the_after_tools_event() -> None:
    batches = Batches()
    script = [[call("stops", "a", text="x"), call("echo", "b", text="y")], "never"]
    agent = make_agent(script, checkpointing=False, hooks=[batches], tools=[stops, echo])
    CANCEL["current"] = CancelSignal()
    out = await invoke(agent, new_state(), "go", cancel=CANCEL["current"])
    assert out.stop == "cancelled"
    assert batches.seen == [
        ("before", []),
        ("after", [("a", "x"), ("b", "Tool execution cancelled")]),
    ]


async def test_results_of_an_abandoned_batch_are_added_before_the_invocation_starts() -> None:
    recorder = Recorder()
    agent = make_agent([call("echo", "e", text="a"), "done"], hooks=[recorder])
    paused = await invoke(agent, new_state(), "go")
    assert paused.state.pending is not None
    recorder.seen.clear()
    out = await invoke(agent, paused.state, "something else")
    # The synthetic results, then the prompt joined to that same user message.
    assert recorder.seen[:3] == ["MessageAdded:user", "BeforeInvocation", "MessageAdded:user"]
    assert out.state.messages[2]["content"][0]["toolResult"]["content"] == [
        {"text": "Tool was interrupted."}
    ]
    # Each event carries the message as added, not the one history joined it into.
    results, prompt = recorder.added[-3:-1]
    assert [list(block) for block in results["content"]] == [["toolResult"]]
    assert prompt["content"] == [{"text": "something else"}]


class RaisingAfterToolCall(HookProvider):
    """Raises from its after-tool-call callback the first ``times`` times; records what the
    other after-tool-call callback (registered first, so it runs after) sees."""

    def __init__(self, times: int) -> None:
        self.times = times
        self.seen: list[tuple[dict[str, Any], str | None]] = []

    def register_hooks(self, registry: HookRegistry) -> None:
        registry.add_callback(AfterToolCallEvent, self.record)
        registry.add_callback(AfterToolCallEvent, self.boom)

    def record(self, event: AfterToolCallEvent) -> None:
        exception = None if event.exception is None else repr(event.exception)
        self.seen.append((event.result["toolResult"], exception))

    def boom(self, event: AfterToolCallEvent) -> None:
        if self.times > 0:
            self.times -= 1
            raise RuntimeError("hook boom")


@pytest.mark.parametrize("executor", ["sequential", "concurrent"])
async def test_an_after_tool_call_hook_that_raises_makes_the_result_an_error(
    executor: str,
) -> None:
    # As the reference: its failure is caught like a tool's, the result becomes its text and
    # the after-tool-call hooks fire again with it as the exception; the turn goes on.
    hook = RaisingAfterToolCall(times=1)
    agent = make_agent(
        [call("echo", "e", text="a"), "done"],
        checkpointing=False,
        executor=executor,
        hooks=[hook],
    )
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "end_turn"
    error = {"toolUseId": "e", "status": "error", "content": [{"text": "Error: hook boom"}]}
    assert hook.seen == [(error, "RuntimeError('hook boom')")]
    assert results_of(out.state.messages[2]) == [error]
    check_history(out.state)


async def test_an_after_tool_call_hook_that_raises_again_fails_the_invocation() -> None:
    # The reference's second firing is outside its catch: the invocation raises, no loop.
    hook = RaisingAfterToolCall(times=2)
    agent = make_agent([call("echo", "e", text="a"), "done"], checkpointing=False, hooks=[hook])
    with pytest.raises(RuntimeError, match="hook boom"):
        await invoke(agent, new_state(), "go")
    assert hook.seen == []


async def test_after_model_call_sees_tool_use_for_an_end_turn_asking_for_tools() -> None:
    # The reference turns the stop reason into tool_use while streaming, before its hooks.
    seen: list[str | None] = []

    class Stops(HookProvider):
        def register_hooks(self, registry: HookRegistry) -> None:
            registry.add_callback(
                AfterModelCallEvent, lambda e: seen.append(e.reply.stop_reason if e.reply else None)
            )

    ends_with_a_call = ScriptedReply(
        content=[{"toolUse": {"toolUseId": "e", "name": "echo", "input": {"text": "a"}}}],
        stop_reason="end_turn",
    )
    agent = make_agent([ends_with_a_call, "done"], checkpointing=False, hooks=[Stops()])
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "end_turn"
    assert seen == ["tool_use", "end_turn"]
    assert results_of(out.state.messages[2])[0]["content"] == [{"text": "a"}]


async def test_a_hook_written_with_strands_field_names_works() -> None:
    # Strands' names, as read-only aliases or fields of their own (docs/from-strands.md).
    seen: list[object] = []

    class Ported(HookProvider):
        def register_hooks(self, registry: HookRegistry) -> None:
            registry.add_callback(BeforeModelCallEvent, self.before_model)
            registry.add_callback(AfterModelCallEvent, self.after_model)
            registry.add_callback(BeforeToolsEvent, lambda e: seen.append(e.invocation_state["k"]))
            registry.add_callback(AfterToolsEvent, lambda e: seen.append(e.invocation_state["k"]))
            registry.add_callback(BeforeToolCallEvent, lambda e: seen.append(e.selected_tool.name))
            registry.add_callback(AfterToolCallEvent, self.after_tool)
            registry.add_callback(AfterInvocationEvent, lambda e: seen.append(e.invocation_state))

        def before_model(self, event: BeforeModelCallEvent) -> None:
            seen.append((event.invocation_state["k"], event.projected_input_tokens))

        def after_model(self, event: AfterModelCallEvent) -> None:
            response = event.stop_response
            assert response is not None and event.exception is None
            seen.append((response.stop_reason, response.message["role"]))

        def after_tool(self, event: AfterToolCallEvent) -> None:
            assert event.duration is not None and event.duration >= 0
            seen.append((event.selected_tool.name, event.invocation_state["k"]))

    agent = make_agent([call("echo", "e", text="a"), "done"], checkpointing=False, hooks=[Ported()])
    await invoke(agent, new_state(), "go", invocation_state={"k": 1})
    assert seen[:-1] == [
        (1, None),
        ("tool_use", "assistant"),
        1,
        "echo",
        ("echo", 1),
        1,
        (1, None),
        ("end_turn", "assistant"),
    ]
    assert isinstance(seen[-1], dict) and seen[-1]["k"] == 1


async def test_the_strands_aliases_are_read_only() -> None:
    def after_model(event: AfterModelCallEvent) -> None:
        with pytest.raises(AttributeError):
            event.stop_response = None  # type: ignore[misc]

    class Writes(HookProvider):
        def register_hooks(self, registry: HookRegistry) -> None:
            registry.add_callback(AfterModelCallEvent, after_model)

    agent = make_agent(["done"], checkpointing=False, hooks=[Writes()])
    assert (await invoke(agent, new_state(), "go")).stop == "end_turn"


@pytest.mark.parametrize(
    "raising",
    # An after-tool-call hook that raises makes the tool's result an error instead.
    [event for event in ALL_EVENTS if event is not AfterToolCallEvent],
    ids=lambda event: event.__name__,
)
async def test_a_hook_that_raises_fails_the_invocation_and_no_hook_fires_after_it(
    raising: type[HookEvent],
) -> None:
    # A deliberate difference (docs/from-strands.md): the command fails `internal` and the
    # session stays as it was; Strands fires its after-hooks first and keeps what was added.
    recorder = Recorder()

    def boom(event: HookEvent) -> None:
        raise RuntimeError("boom")

    class Raises(HookProvider):
        def register_hooks(self, registry: HookRegistry) -> None:
            registry.add_callback(raising, boom)

    # Registered last, the raising callback runs last of a Before* event and first of an After*.
    agent = make_agent(
        [call("echo", "e", text="a"), "done"], checkpointing=False, hooks=[recorder, Raises()]
    )
    state = new_state()
    with pytest.raises(RuntimeError, match="boom"):
        await invoke(agent, state, "go")
    name = raising.__name__.removesuffix("Event")
    if name == "MessageAdded":
        name += ":user"
    if name.startswith("After"):
        assert name not in recorder.seen
    else:
        assert recorder.seen[-1] == name
    assert state.messages == []
