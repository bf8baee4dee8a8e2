"""Hook events (SEMANTICS §7): which fire, in what order; validation failures fire none."""

from __future__ import annotations

import pytest
from engine_helpers import call, invoke, make_agent, resume

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

    def register_hooks(self, registry: HookRegistry) -> None:
        for event_type in ALL_EVENTS:
            registry.add_callback(event_type, self.on)

    async def on(self, event: HookEvent) -> None:
        name = type(event).__name__.removesuffix("Event")
        if isinstance(event, MessageAddedEvent):
            name += f":{event.message['role']}"
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
