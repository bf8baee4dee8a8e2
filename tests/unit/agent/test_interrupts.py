"""Interrupts (SEMANTICS §4): raising from tools and hooks, ids, answering, executors."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from engine_helpers import (
    TOOLS,
    answers,
    call,
    check_history,
    invoke,
    make_agent,
    model_of,
    results_of,
    resume,
    roundtrip,
)

from service.agent.errors import (
    InterruptPendingError,
    InvalidInputError,
    NoPendingInterruptError,
    UnknownInterruptError,
)
from service.agent.events import InterruptRaised, ToolFinished, ToolStarted
from service.agent.hooks import (
    BeforeToolCallEvent,
    BeforeToolsEvent,
    HookProvider,
    HookRegistry,
)
from service.agent.state import SessionState
from service.agent.tools import ToolContext, tool


def oid(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_OID, name))


def new_state() -> SessionState:
    return SessionState(session_id="s-int")


RAN: list[str] = []


@tool(inline=True)
def record(label: str) -> str:
    """Record that it ran."""
    RAN.append(label)
    return f"ran {label}"


@tool(inline=True)
def two_questions(context: ToolContext) -> str:
    """Ask twice."""
    first = context.interrupt("first")
    second = context.interrupt("second", reason="more")
    return f"{first}+{second}"


REASONS = iter(range(1, 1000))


@tool(inline=True)
def asks_anew(context: ToolContext) -> str:
    """Ask with a new reason every time it runs."""
    return str(context.interrupt("again", reason={"run": next(REASONS)}))


@tool(inline=True)
def preset(context: ToolContext) -> str:
    """Interrupt with a pre-set response: does not pause."""
    return str(context.interrupt("auto", response="yes"))


ALL_TOOLS = [*TOOLS, record, two_questions, asks_anew, preset]


@pytest.fixture(autouse=True)
def _clear() -> None:
    RAN.clear()


async def test_tool_interrupt_pauses_with_deterministic_id() -> None:
    agent = make_agent([call("approve", "t1", action="deploy"), "done"], checkpointing=False)
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "interrupt"
    assert out.result.checkpoint is None
    interrupts = out.result.to_dict()["interrupts"]
    assert interrupts == [
        {
            "id": f"v1:tool_call:t1:{oid('approval')}",
            "name": "approval",
            "reason": {"action": "deploy"},
            "response": None,
        }
    ]
    assert out.of(InterruptRaised)[0].interrupts == out.result.interrupts
    assert out.result.message == out.state.messages[-1]
    assert out.state.interrupted
    check_history(out.state)


async def test_answer_runs_the_tool_again_with_the_response() -> None:
    agent = make_agent([call("approve", "t1", action="deploy"), "done"], checkpointing=False)
    out = await invoke(agent, new_state(), "go")
    calls = model_of(agent).calls
    out = await invoke(agent, roundtrip(out.state), answers((out.result.interrupts[0].id, "yes")))
    assert out.stop == "end_turn"
    assert results_of(out.state.messages[2])[0]["content"] == [{"text": "deploy:yes"}]
    assert model_of(agent).calls == calls + 1
    assert not out.state.interrupted
    check_history(out.state)


async def test_an_id_answered_twice_in_one_resume_keeps_its_last_answer() -> None:
    agent = make_agent([call("approve", "t1", action="deploy"), "done"], checkpointing=False)
    out = await invoke(agent, new_state(), "go")
    interrupt_id = out.result.interrupts[0].id
    out = await invoke(agent, out.state, answers((interrupt_id, "no"), (interrupt_id, "yes")))
    assert out.stop == "end_turn"
    assert results_of(out.state.messages[2])[0]["content"] == [{"text": "deploy:yes"}]


async def test_interrupt_beats_checkpoint_and_answer_pauses_after_tools() -> None:
    agent = make_agent([call("approve", "t1", action="x"), "done"])
    out = await invoke(agent, new_state(), "go")
    assert out.checkpoint == {"position": "after_model", "cycle_index": 0, "schema_version": "1.0"}
    out = await invoke(agent, out.state, resume(out))
    assert out.stop == "interrupt" and out.result.checkpoint is None
    assert out.state.checkpoint is None
    calls = model_of(agent).calls
    out = await invoke(agent, out.state, answers((out.result.interrupts[0].id, "ok")))
    assert model_of(agent).calls == calls, "answering never calls the model"
    assert out.checkpoint == {"position": "after_tools", "cycle_index": 0, "schema_version": "1.0"}
    out = await invoke(agent, out.state, resume(out))
    assert out.stop == "end_turn"


async def test_interrupt_in_second_cycle_keeps_the_turn_cycle_index() -> None:
    agent = make_agent([call("echo", text="a"), call("approve", "t2", action="b"), "done"])
    out = await invoke(agent, new_state(), "go")
    for _ in range(3):
        out = await invoke(agent, out.state, resume(out))
    assert out.stop == "interrupt"
    out = await invoke(agent, out.state, answers((out.result.interrupts[0].id, "fine")))
    assert out.checkpoint == {"position": "after_tools", "cycle_index": 1, "schema_version": "1.0"}


async def test_sequential_interrupt_stops_later_tools() -> None:
    script = [
        [
            call("record", "a", label="a"),
            call("approve", "b", action="x"),
            call("record", "c", label="c"),
        ],
        "done",
    ]
    agent = make_agent(script, checkpointing=False, tools=ALL_TOOLS)
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "interrupt"
    assert RAN == ["a"]
    assert out.state.pending is not None and set(out.state.pending.results) == {"a"}
    out = await invoke(agent, out.state, answers((out.result.interrupts[0].id, "y")))
    assert RAN == ["a", "c"], "only tools without a result run again"
    assert [r["toolUseId"] for r in results_of(out.state.messages[2])] == ["a", "b", "c"]
    check_history(out.state)


async def test_concurrent_interrupt_keeps_the_others_results_in_tool_use_order() -> None:
    script = [
        [
            call("record", "a", label="a"),
            call("approve", "b", action="x"),
            call("record", "c", label="c"),
        ],
        "done",
    ]
    agent = make_agent(script, checkpointing=False, executor="concurrent", tools=ALL_TOOLS)
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "interrupt"
    assert sorted(RAN) == ["a", "c"]
    out = await invoke(agent, out.state, answers((out.result.interrupts[0].id, "y")))
    assert sorted(RAN) == ["a", "c"]
    results = results_of(out.state.messages[2])
    assert [r["toolUseId"] for r in results] == ["a", "b", "c"]
    assert results[1]["content"] == [{"text": "x:y"}]
    check_history(out.state)


async def test_concurrent_two_interrupts_partial_answer() -> None:
    script = [[call("approve", "a", action="one"), call("approve", "b", action="two")], "done"]
    agent = make_agent(script, checkpointing=False, executor="concurrent")
    out = await invoke(agent, new_state(), "go")
    ids = [i.id for i in out.result.interrupts or []]
    assert ids == [f"v1:tool_call:a:{oid('approval')}", f"v1:tool_call:b:{oid('approval')}"]
    out = await invoke(agent, out.state, answers((ids[0], "yes")))
    assert out.stop == "interrupt"
    assert [i.id for i in out.result.interrupts or []] == [ids[1]]
    assert out.state.pending is not None and set(out.state.pending.results) == {"a"}
    out = await invoke(agent, out.state, answers((ids[1], "also")))
    assert out.stop == "end_turn"
    assert [r["content"][0]["text"] for r in results_of(out.state.messages[2])] == [
        "one:yes",
        "two:also",
    ]


async def test_null_response_interrupts_again() -> None:
    agent = make_agent([call("approve", "t", action="x"), "done"], checkpointing=False)
    out = await invoke(agent, new_state(), "go")
    interrupt_id = out.result.interrupts[0].id
    out = await invoke(agent, out.state, answers((interrupt_id, None)))
    assert out.stop == "interrupt"
    assert [i.id for i in out.result.interrupts or []] == [interrupt_id]
    assert out.result.interrupts[0].response is None
    out = await invoke(agent, out.state, answers((interrupt_id, "now")))
    assert out.stop == "end_turn"


async def test_an_interrupt_raised_again_keeps_its_first_reason() -> None:
    agent = make_agent([call("asks_anew", "n"), "done"], checkpointing=False, tools=ALL_TOOLS)
    out = await invoke(agent, new_state(), "go")
    [first] = out.result.interrupts or []
    out = await invoke(agent, roundtrip(out.state), answers((first.id, None)))
    [again] = out.result.interrupts or []
    assert (again.id, again.reason) == (first.id, first.reason)
    out = await invoke(agent, out.state, answers((first.id, "ok")))
    assert results_of(out.state.messages[2])[0]["content"] == [{"text": "ok"}]


async def test_a_tool_asking_twice_keeps_the_first_answer() -> None:
    agent = make_agent([call("two_questions", "q"), "done"], checkpointing=False, tools=ALL_TOOLS)
    out = await invoke(agent, new_state(), "go")
    first = out.result.interrupts[0]
    assert first.name == "first"
    out = await invoke(agent, out.state, answers((first.id, 1)))
    second = out.result.interrupts[0]
    assert second.name == "second" and second.reason == "more"
    out = await invoke(agent, roundtrip(out.state), answers((second.id, 2)))
    assert results_of(out.state.messages[2])[0]["content"] == [{"text": "1+2"}]


async def test_preset_response_does_not_pause() -> None:
    agent = make_agent([call("preset", "p"), "done"], checkpointing=False, tools=ALL_TOOLS)
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "end_turn"
    assert results_of(out.state.messages[2])[0]["content"] == [{"text": "yes"}]


async def test_unknown_id_rejects_the_whole_answer_atomically() -> None:
    script = [[call("approve", "a", action="one"), call("approve", "b", action="two")], "done"]
    agent = make_agent(script, checkpointing=False, executor="concurrent")
    out = await invoke(agent, new_state(), "go")
    before = roundtrip(out.state)
    good = out.result.interrupts[0].id
    with pytest.raises(UnknownInterruptError) as info:
        await invoke(agent, out.state, answers((good, "yes"), ("v1:tool_call:zz:nope", "no")))
    assert info.value.code == "unknown_interrupt"
    assert out.state == before
    assert out.state.pending is not None
    assert all(i.response is None for i in out.state.pending.interrupts)


async def test_answers_with_nothing_pending_are_rejected() -> None:
    agent = make_agent(["hi"])
    with pytest.raises(NoPendingInterruptError) as info:
        await invoke(agent, new_state(), answers(("v1:tool_call:x:y", "z")))
    assert info.value.code == "no_pending_interrupt"
    paused = await invoke(make_agent([call("echo", text="a"), "x"]), new_state(), "go")
    with pytest.raises(NoPendingInterruptError):
        await invoke(agent, paused.state, answers(("v1:tool_call:x:y", "z")))


@pytest.mark.parametrize(
    "bad",
    [
        [{"interruptResponse": {"interruptId": "x"}}],
        [{"interruptResponse": {"response": 1}}],
        [{"interruptResponse": "x"}],
        [{"interruptResponse": {"interruptId": 5, "response": 1}}],
        [{"interruptResponse": {"interruptId": "x", "response": 1}}, {"text": "hi"}],
    ],
)
async def test_malformed_answers_are_invalid(bad: Any) -> None:
    agent = make_agent([call("approve", "t", action="x"), "done"], checkpointing=False)
    out = await invoke(agent, new_state(), "go")
    with pytest.raises(InvalidInputError):
        await invoke(agent, out.state, bad)


async def test_prompt_while_interrupt_pending_is_rejected() -> None:
    agent = make_agent([call("approve", "t", action="x"), "done"], checkpointing=False)
    out = await invoke(agent, new_state(), "go")
    with pytest.raises(InterruptPendingError):
        await invoke(agent, out.state, "something else")


class BeforeToolsGate(HookProvider):
    def __init__(self) -> None:
        self.answers: list[Any] = []

    def register_hooks(self, registry: HookRegistry) -> None:
        registry.add_callback(BeforeToolsEvent, self.check)

    def check(self, event: BeforeToolsEvent) -> None:
        self.answers.append(event.interrupt("batch_ok", reason=len(event.tool_uses)))


class BeforeCallGate(HookProvider):
    def __init__(self, only: str) -> None:
        self.only = only

    def register_hooks(self, registry: HookRegistry) -> None:
        registry.add_callback(BeforeToolCallEvent, self.check)

    async def check(self, event: BeforeToolCallEvent) -> None:
        if event.tool_use["name"] == self.only:
            answer = event.interrupt("call_ok")
            if answer == "skip":
                event.cancel_tool = "skipped by reviewer"


@pytest.mark.parametrize("checkpointing", [False, True])
async def test_before_tools_hook_interrupt(checkpointing: bool) -> None:
    gate = BeforeToolsGate()
    script = [[call("record", "a", label="a"), call("record", "b", label="b")], "done"]
    agent = make_agent(script, checkpointing=checkpointing, hooks=[gate], tools=ALL_TOOLS)
    out = await invoke(agent, new_state(), "go")
    if checkpointing:
        out = await invoke(agent, out.state, resume(out))
    assert out.stop == "interrupt"
    assert [i.to_dict() for i in out.result.interrupts or []] == [
        {
            "id": f"v1:before_tools:{oid('batch_ok')}",
            "name": "batch_ok",
            "reason": 2,
            "response": None,
        }
    ]
    assert RAN == []
    out = await invoke(agent, out.state, answers((out.result.interrupts[0].id, "go ahead")))
    assert RAN == ["a", "b"]
    assert gate.answers == ["go ahead"]
    assert out.stop == ("checkpoint" if checkpointing else "end_turn")


async def test_before_tool_call_hook_interrupt_and_skip() -> None:
    script = [[call("record", "a", label="a"), call("record", "b", label="b")], "done"]
    agent = make_agent(
        script, checkpointing=False, hooks=[BeforeCallGate("record")], tools=ALL_TOOLS
    )
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "interrupt"
    assert out.result.interrupts[0].id == f"v1:before_tool_call:a:{oid('call_ok')}"
    assert not out.of(ToolStarted)
    out = await invoke(agent, out.state, answers((out.result.interrupts[0].id, "skip")))
    assert out.result.interrupts[0].id == f"v1:before_tool_call:b:{oid('call_ok')}"
    out = await invoke(agent, out.state, answers((out.result.interrupts[0].id, "fine")))
    assert out.stop == "end_turn"
    assert RAN == ["b"]
    results = results_of(out.state.messages[2])
    assert results[0] == {
        "toolUseId": "a",
        "status": "error",
        "content": [{"text": "skipped by reviewer"}],
    }
    assert results[1]["content"] == [{"text": "ran b"}]


async def test_before_tool_call_interrupt_with_concurrent_executor() -> None:
    script = [[call("echo", "a", text="a"), call("record", "b", label="b")], "done"]
    agent = make_agent(
        script,
        checkpointing=False,
        executor="concurrent",
        hooks=[BeforeCallGate("record")],
        tools=ALL_TOOLS,
    )
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "interrupt"
    assert out.state.pending is not None and set(out.state.pending.results) == {"a"}
    assert [e.tool_use_id for e in out.of(ToolFinished)] == ["a"]
    out = await invoke(agent, out.state, answers((out.result.interrupts[0].id, "ok")))
    assert [r["toolUseId"] for r in results_of(out.state.messages[2])] == ["a", "b"]
    assert RAN == ["b"]


async def test_interrupted_tool_reports_finished_interrupted() -> None:
    agent = make_agent([call("approve", "t", action="x"), "done"], checkpointing=False)
    out = await invoke(agent, new_state(), "go")
    assert [(e.tool_use_id, e.status) for e in out.of(ToolFinished)] == [("t", "interrupted")]


async def test_an_id_answered_by_an_earlier_resume_is_accepted_and_its_tool_keeps_its_result() -> (
    None
):
    # As in the reference: answered interrupts stay in the interrupt state until the batch
    # completes, so naming one again is no unknown id; a tool that already ran with the first
    # answer keeps that result (docs/clients.md, "Answer an interrupt").
    script = [[call("approve", "a", action="one"), call("approve", "b", action="two")], "done"]
    agent = make_agent(script, checkpointing=False, executor="concurrent")
    out = await invoke(agent, new_state(), "go")
    ids = [i.id for i in out.result.interrupts or []]
    out = await invoke(agent, out.state, answers((ids[0], "yes")))
    out = await invoke(agent, out.state, answers((ids[0], "changed")))
    assert out.stop == "interrupt"
    assert [i.id for i in out.result.interrupts or []] == [ids[1]]
    out = await invoke(agent, out.state, answers((ids[1], "also")))
    assert [r["content"][0]["text"] for r in results_of(out.state.messages[2])] == [
        "one:yes",
        "two:also",
    ]
