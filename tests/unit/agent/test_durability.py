"""Durability inside one invocation: boundaries carry an in-flight marker; a redelivered command
continues from the last committed boundary instead of starting over."""

from __future__ import annotations

from engine_helpers import call, check_history, invoke, make_agent, model_of, resume, roundtrip

from service.agent.events import Boundary
from service.agent.loop import Invocation, run_invocation
from service.agent.state import SessionState

SCRIPT = [call("echo", "t0", text="a"), call("add", "t1", a=1, b=2), "done"]


def new_state() -> SessionState:
    return SessionState(session_id="s-dur")


async def test_boundaries_carry_the_inflight_marker_and_a_consistent_state() -> None:
    agent = make_agent(SCRIPT, checkpointing=False)
    out = await invoke(agent, new_state(), "go", command_id="cmd-1")
    boundaries = out.of(Boundary)
    assert len(boundaries) == 4
    for b in boundaries:
        marker = b.state.inflight
        assert marker is not None and marker.command_id == "cmd-1"
        assert (marker.position, marker.cycle_index) == (b.position, b.cycle_index)
        check_history(b.state)
        assert roundtrip(b.state) == b.state
    assert out.state.inflight is None


async def test_boundary_snapshots_are_not_changed_by_the_rest_of_the_run() -> None:
    agent = make_agent(SCRIPT, checkpointing=False)
    invocation = Invocation("cmd-x", "go")
    frozen = []
    async for event in run_invocation(agent, new_state(), invocation):
        if isinstance(event, Boundary):
            frozen.append((event.state, roundtrip(event.state)))
    for live, copy in frozen:
        assert live == copy


async def test_crash_after_each_boundary_continues_to_the_same_end() -> None:
    reference = await invoke(
        make_agent(SCRIPT, checkpointing=False), new_state(), "go", command_id="c"
    )
    for index, boundary in enumerate(reference.of(Boundary)):
        agent = make_agent(SCRIPT, checkpointing=False)
        committed = roundtrip(boundary.state)
        out = await invoke(agent, committed, "go", command_id="c")
        assert out.stop == "end_turn", index
        assert out.state.messages == reference.state.messages
        assert out.result.message == reference.result.message
        remaining_model_calls = 2 - index // 2
        assert model_of(agent).calls == remaining_model_calls
        assert out.state.inflight is None
        check_history(out.state)


async def test_crash_recovery_reruns_the_pending_batch_at_least_once() -> None:
    calls: list[str] = []
    from service.agent.tools import ToolContext, tool

    @tool(inline=True)
    def effect(context: ToolContext) -> str:
        """A side effect keyed by the idempotency key."""
        calls.append(context.idempotency_key)
        return "ok"

    script = [call("effect"), "done"]
    agent = make_agent(script, checkpointing=False, tools=[effect])
    invocation = Invocation("cmd-r", "go")
    crashed_at = None
    async for event in run_invocation(agent, new_state(), invocation):
        if isinstance(event, Boundary) and event.position == "after_model":
            crashed_at = roundtrip(event.state)
            break
    assert crashed_at is not None
    out = await invoke(
        make_agent(script, checkpointing=False, tools=[effect]),
        crashed_at,
        "go",
        command_id="cmd-r",
    )
    assert out.stop == "end_turn"
    assert len(calls) == 1
    assert (
        calls[0]
        == f"s-dur:{crashed_at.pending.assistant_message['content'][0]['toolUse']['toolUseId']}"
    )


async def test_another_command_after_a_crash_abandons_the_inflight_batch() -> None:
    agent = make_agent(SCRIPT, checkpointing=False)
    reference = await invoke(agent, new_state(), "go", command_id="c")
    crashed = roundtrip(reference.of(Boundary)[0].state)
    out = await invoke(make_agent(["hello"], checkpointing=False), crashed, "new", command_id="d")
    assert out.stop == "end_turn"
    assert out.state.inflight is None
    check_history(out.state)


async def test_checkpointing_turn_emits_no_boundary() -> None:
    agent = make_agent(SCRIPT)
    out = await invoke(agent, new_state(), "go")
    while out.stop == "checkpoint":
        assert not out.of(Boundary)
        out = await invoke(agent, out.state, resume(out))
    assert not out.of(Boundary)
