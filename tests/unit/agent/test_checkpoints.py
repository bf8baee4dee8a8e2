"""Checkpoints (SEMANTICS §3): when they fire, their form, resuming, and every rejection."""

from __future__ import annotations

from typing import Any

import pytest
from engine_helpers import (
    add,
    answers,
    approve,
    call,
    check_history,
    echo,
    invoke,
    make_agent,
    model_of,
    results_of,
    resume,
    roundtrip,
    texts,
)

from service.agent.errors import (
    CheckpointIncompatibleError,
    CheckpointingDisabledError,
    CheckpointStaleError,
    InterruptPendingError,
    InvalidInputError,
    ModelError,
)
from service.agent.events import Boundary, CheckpointReached, ModelMessage, Stopped
from service.agent.state import SessionState
from service.agent.types import Checkpoint

TWO_CYCLES = [call("add", a=1, b=2), call("add", a=3, b=4), "seven"]


def new_state() -> SessionState:
    return SessionState(session_id="s-1")


async def test_text_only_turn_emits_no_checkpoint() -> None:
    agent = make_agent(["hello there"])
    out = await invoke(agent, new_state(), "hi")
    assert out.stop == "end_turn"
    assert out.result.checkpoint is None
    assert out.result.message == {"role": "assistant", "content": [{"text": "hello there"}]}
    assert out.state.checkpoint is None
    assert not out.of(CheckpointReached)
    assert [m["role"] for m in out.state.messages] == ["user", "assistant"]
    assert out.result.to_dict()["type"] == "agent_result"


async def test_two_cycles_pause_at_every_boundary() -> None:
    agent = make_agent(TWO_CYCLES)
    out = await invoke(agent, new_state(), "compute")
    seen = [(out.stop, out.checkpoint)]
    while out.stop == "checkpoint":
        out = await invoke(agent, roundtrip(out.state), resume(out))
        seen.append((out.stop, out.checkpoint))
    positions = [(c["position"], c["cycle_index"]) for _, c in seen if c]
    assert positions == [
        ("after_model", 0),
        ("after_tools", 0),
        ("after_model", 1),
        ("after_tools", 1),
    ]
    assert seen[-1] == ("end_turn", None)
    assert len(seen) == 5
    assert texts(out.state.messages[-1]) == ["seven"]
    check_history(out.state)
    assert out.state.checkpoint is None and out.state.pending is None


async def test_one_cycle_turn_takes_three_invocations() -> None:
    agent = make_agent([call("echo", text="x"), "done"])
    out = await invoke(agent, new_state(), "go")
    stops = [out.stop]
    while out.stop == "checkpoint":
        out = await invoke(agent, out.state, resume(out))
        stops.append(out.stop)
    assert stops == ["checkpoint", "checkpoint", "end_turn"]


async def test_checkpoint_serialized_form_is_exact() -> None:
    agent = make_agent(TWO_CYCLES)
    out = await invoke(agent, new_state(), "compute")
    assert out.result.to_dict()["checkpoint"] == {
        "position": "after_model",
        "cycle_index": 0,
        "schema_version": "1.0",
    }
    assert out.of(CheckpointReached)[0].checkpoint == out.result.checkpoint


async def test_after_model_pause_has_assistant_message_and_no_tool_run() -> None:
    agent = make_agent(TWO_CYCLES)
    out = await invoke(agent, new_state(), "compute")
    last = out.state.messages[-1]
    assert last["role"] == "assistant" and "toolUse" in last["content"][0]
    assert out.result.message == last
    assert out.state.pending is not None and not out.state.pending.results
    assert out.result.metrics["invocation"]["tools"] == {}


async def test_after_tools_pause_message_is_the_tool_use_message() -> None:
    agent = make_agent(TWO_CYCLES)
    first = await invoke(agent, new_state(), "compute")
    second = await invoke(agent, first.state, resume(first))
    assert second.checkpoint == {
        "position": "after_tools",
        "cycle_index": 0,
        "schema_version": "1.0",
    }
    assert second.result.message == first.result.message
    assert results_of(second.state.messages[-1])[0]["content"] == [{"text": "3"}]
    assert model_of(agent).calls == 1, "resuming after_model must not call the model"


async def test_resume_after_tools_calls_model_once() -> None:
    agent = make_agent(TWO_CYCLES)
    out = await invoke(agent, new_state(), "compute")
    out = await invoke(agent, out.state, resume(out))
    calls = model_of(agent).calls
    out = await invoke(agent, out.state, resume(out))
    assert model_of(agent).calls == calls + 1
    assert out.checkpoint == {"position": "after_model", "cycle_index": 1, "schema_version": "1.0"}


@pytest.mark.parametrize("pause", [0, 1, 2, 3])
async def test_resume_from_each_position_equals_uninterrupted_run(pause: int) -> None:
    """Stopping at pause k, encoding and resuming gives the same history as never stopping."""
    reference_agent = make_agent(TWO_CYCLES)
    out = await invoke(reference_agent, new_state(), "compute")
    while out.stop == "checkpoint":
        out = await invoke(reference_agent, out.state, resume(out))
    reference = out.state.messages

    agent = make_agent(TWO_CYCLES)
    out = await invoke(agent, new_state(), "compute")
    for _ in range(pause):
        out = await invoke(agent, out.state, resume(out))
    restored = roundtrip(out.state)
    fresh_agent = make_agent(TWO_CYCLES)
    out = await invoke(fresh_agent, restored, resume(out))
    while out.stop == "checkpoint":
        out = await invoke(fresh_agent, out.state, resume(out))
    assert out.state.messages == reference


async def test_checkpointing_off_runs_the_whole_turn_with_boundaries() -> None:
    agent = make_agent(TWO_CYCLES, checkpointing=False)
    out = await invoke(agent, new_state(), "compute")
    assert out.stop == "end_turn"
    boundaries = [(b.position, b.cycle_index) for b in out.of(Boundary)]
    assert boundaries == [
        ("after_model", 0),
        ("after_tools", 0),
        ("after_model", 1),
        ("after_tools", 1),
    ]
    for boundary in out.of(Boundary):
        assert boundary.state.inflight is not None
        assert boundary.state.inflight.position == boundary.position
    assert out.state.inflight is None
    check_history(out.state)


async def test_invocation_checkpointing_overrides_agent_default_and_sticks_to_the_turn() -> None:
    agent = make_agent(TWO_CYCLES, checkpointing=False)
    out = await invoke(agent, new_state(), "compute", checkpointing=True)
    assert out.stop == "checkpoint"
    out = await invoke(agent, out.state, resume(out))
    assert out.stop == "checkpoint", "a resume without the flag keeps the turn's checkpointing"


async def test_a_resumes_checkpointing_sticks_to_the_rest_of_its_turn() -> None:
    agent = make_agent([call("approve", action="deploy"), "done"], checkpointing=False)
    out = await invoke(agent, new_state(), "deploy")
    assert out.stop == "interrupt"
    (interrupt,) = out.result.interrupts or []
    out = await invoke(
        agent, roundtrip(out.state), answers((interrupt.id, "yes")), checkpointing=True
    )
    assert out.stop == "checkpoint" and out.checkpoint is not None
    assert out.checkpoint["position"] == "after_tools"
    out = await invoke(agent, roundtrip(out.state), resume(out))
    assert out.stop == "end_turn", "the checkpoint it issued resumes without the flag again"


async def test_resume_with_checkpointing_off_is_rejected() -> None:
    agent = make_agent(TWO_CYCLES)
    out = await invoke(agent, new_state(), "compute")
    with pytest.raises(CheckpointingDisabledError) as info:
        await invoke(agent, out.state, resume(out), checkpointing=False)
    assert str(info.value) == (
        "this resume sets checkpointing to false: a checkpoint resume needs it on"
    ), "the agent and the turn have it on: the resume's own field is what is refused"
    plain = make_agent(TWO_CYCLES, checkpointing=False)
    with pytest.raises(CheckpointingDisabledError) as info:
        await invoke(plain, new_state(), resume(out))
    assert info.value.code == "checkpointing_disabled"
    assert str(info.value) == "checkpointing is off for this agent"


async def test_a_refused_resume_names_the_setting_the_turn_began_with() -> None:
    """A turn keeps its checkpointing: the invoke's when it set one, else the agent's, and the
    refusal says which (an invoke that set nothing on an agent without it is the agent's)."""
    plain = make_agent(TWO_CYCLES, checkpointing=False)
    began = await invoke(plain, new_state(), "compute")
    with pytest.raises(CheckpointingDisabledError) as info:
        await invoke(plain, began.state, resume({"position": "after_model", "cycle_index": 0}))
    assert str(info.value) == "checkpointing is off for this agent"

    agent = make_agent(TWO_CYCLES)
    began = await invoke(agent, new_state(), "compute", checkpointing=False)
    with pytest.raises(CheckpointingDisabledError) as info:
        await invoke(agent, began.state, resume({"position": "after_model", "cycle_index": 0}))
    assert str(info.value) == "checkpointing is off for this turn (its invoke set it to false)"


async def _paused() -> tuple[Any, Any]:
    agent = make_agent(TWO_CYCLES)
    first = await invoke(agent, new_state(), "compute")
    second = await invoke(agent, first.state, resume(first))
    return agent, (first, second)


async def test_stale_and_replayed_checkpoints_are_rejected_with_nothing_changed() -> None:
    agent, (first, second) = await _paused()
    before = roundtrip(second.state)
    calls = model_of(agent).calls
    for stale in (
        resume(first),  # replayed: already used
        resume({"position": "after_model", "cycle_index": 1, "schema_version": "1.0"}),  # future
        resume({"position": "after_tools", "cycle_index": 5, "schema_version": "1.0"}),
    ):
        with pytest.raises(CheckpointStaleError) as info:
            await invoke(agent, second.state, stale)
        assert info.value.code == "checkpoint_stale"
    assert second.state == before
    assert model_of(agent).calls == calls


async def test_checkpoint_from_another_turn_is_stale() -> None:
    """A checkpoint is a position only: another turn's pause is stale unless it is identical."""
    agent = make_agent([call("echo", text="a"), "one"])
    first = await invoke(agent, new_state(), "turn one")
    second_turn = await invoke(agent, first.state, "turn two abandons")
    second_turn = await invoke(agent, second_turn.state, resume(second_turn))
    assert second_turn.checkpoint and second_turn.checkpoint["position"] == "after_tools"
    with pytest.raises(CheckpointStaleError):
        await invoke(agent, second_turn.state, resume(first))


async def test_a_new_turn_without_pause_makes_old_checkpoints_stale() -> None:
    agent = make_agent([call("echo", text="a"), "one"])
    out = await invoke(agent, new_state(), "go")
    out2 = await invoke(agent, out.state, resume(out))
    out3 = await invoke(agent, out2.state, resume(out2))
    assert out3.stop == "end_turn"
    for old in (out, out2):
        with pytest.raises(CheckpointStaleError):
            await invoke(agent, out3.state, resume(old))


@pytest.mark.parametrize(
    "version", [None, 1.0, 1, "2.0", "1", "1.0 ", "v1.0"], ids=lambda v: repr(v)
)
async def test_bad_schema_version_is_incompatible(version: Any) -> None:
    agent, (_, second) = await _paused()
    checkpoint: dict[str, Any] = {"position": "after_tools", "cycle_index": 0}
    if version is not None:
        checkpoint["schema_version"] = version
    with pytest.raises(CheckpointIncompatibleError) as info:
        await invoke(agent, second.state, resume(checkpoint))
    assert info.value.code == "checkpoint_incompatible"


@pytest.mark.parametrize(
    "checkpoint",
    [
        {"position": "somewhere", "cycle_index": 0, "schema_version": "1.0"},
        {"position": "after_tools", "cycle_index": -1, "schema_version": "1.0"},
        {"position": "after_tools", "cycle_index": "0", "schema_version": "1.0"},
        {"position": "after_tools", "cycle_index": True, "schema_version": "1.0"},
        {"cycle_index": 0, "schema_version": "1.0"},
    ],
)
async def test_garbage_position_or_index_is_rejected(checkpoint: dict[str, Any]) -> None:
    agent, (_, second) = await _paused()
    with pytest.raises(CheckpointIncompatibleError):
        await invoke(agent, second.state, resume(checkpoint))


async def test_unknown_checkpoint_keys_are_ignored(caplog: pytest.LogCaptureFixture) -> None:
    agent, (_, second) = await _paused()
    checkpoint = {**(second.checkpoint or {}), "extra": 1}
    out = await invoke(agent, second.state, resume(checkpoint))
    assert out.stop == "checkpoint"
    assert "unknown checkpoint keys" in caplog.text


@pytest.mark.parametrize(
    "payload",
    [
        {"checkpointResume": None},
        {"checkpointResume": "after_model"},
        {"checkpointResume": {}},
        {"checkpointResume": {"position": "after_model"}},
        {"checkpointResume": {"checkpoint": None}},
        {"checkpointResume": {"checkpoint": ["after_model", 0]}},
    ],
)
async def test_malformed_resume_payload_is_rejected(payload: Any) -> None:
    agent, (_, second) = await _paused()
    before = roundtrip(second.state)
    with pytest.raises(CheckpointIncompatibleError):
        await invoke(agent, second.state, payload)
    assert second.state == before


async def test_list_wrapped_resume_is_rejected_before_touching_history() -> None:
    agent = make_agent(TWO_CYCLES)
    first = await invoke(agent, new_state(), "compute")
    before = roundtrip(first.state)
    with pytest.raises(CheckpointIncompatibleError):
        await invoke(agent, first.state, [resume(first)])
    assert first.state == before
    out = await invoke(agent, first.state, resume(first))
    assert out.stop == "checkpoint", "the pending tools still run after the rejected form"
    assert results_of(out.state.messages[-1])[0]["status"] == "success"


async def test_resume_while_interrupt_pending_is_rejected_first() -> None:
    agent = make_agent([call("approve", action="deploy"), "ok"], checkpointing=True)
    out = await invoke(agent, new_state(), "go")
    out = await invoke(agent, out.state, resume(out))
    assert out.stop == "interrupt"
    # interrupt pending beats every other check, even a malformed or disabled resume
    for payload, kwargs in (
        (resume({"position": "after_model", "cycle_index": 0, "schema_version": "1.0"}), {}),
        ({"checkpointResume": None}, {"checkpointing": False}),
        ([{"checkpointResume": {}}], {}),
        ("a new prompt", {}),
    ):
        with pytest.raises(InterruptPendingError) as info:
            await invoke(agent, out.state, payload, **kwargs)
        assert info.value.code == "interrupt_pending"


async def test_validation_order_disabled_before_malformed_before_version_before_stale() -> None:
    agent, (_, second) = await _paused()
    with pytest.raises(CheckpointingDisabledError):
        await invoke(agent, second.state, {"checkpointResume": None}, checkpointing=False)
    with pytest.raises(CheckpointIncompatibleError):
        await invoke(agent, second.state, {"checkpointResume": {}})
    with pytest.raises(CheckpointIncompatibleError):
        stale_and_old = {"position": "after_model", "cycle_index": 9, "schema_version": "0.9"}
        await invoke(agent, second.state, resume(stale_and_old))


async def test_new_prompt_abandons_pending_batch_in_one_user_message() -> None:
    agent = make_agent([call("echo", text="a"), call("add", a=1, b=1), "bye"])
    out = await invoke(agent, new_state(), "first")
    assert out.state.pending is not None
    agent2 = make_agent(["fresh answer"])
    out = await invoke(agent2, out.state, "second")
    check_history(out.state)
    joined = out.state.messages[2]
    assert joined["role"] == "user"
    assert results_of(joined)[0]["status"] == "error"
    assert results_of(joined)[0]["content"] == [{"text": "Tool was interrupted."}]
    assert texts(joined) == ["second"]
    assert out.stop == "end_turn" and out.state.pending is None


async def test_new_prompt_after_tools_pause_joins_the_results_message() -> None:
    agent = make_agent([call("echo", text="a"), "x"])
    out = await invoke(agent, new_state(), "first")
    out = await invoke(agent, out.state, resume(out))
    assert out.state.messages[-1]["role"] == "user"
    out = await invoke(make_agent(["again"]), out.state, "second")
    check_history(out.state)
    assert [m["role"] for m in out.state.messages] == ["user", "assistant", "user", "assistant"]
    assert texts(out.state.messages[2]) == ["second"]
    assert out.state.cycle_index == 0


async def test_new_turn_resets_cycle_index() -> None:
    agent = make_agent([call("echo", text="a"), call("echo", text="b"), "x"])
    out = await invoke(agent, new_state(), "first")
    out = await invoke(agent, out.state, resume(out))
    out = await invoke(agent, out.state, resume(out))
    assert out.checkpoint and out.checkpoint["cycle_index"] == 1
    out = await invoke(make_agent([call("echo", text="c"), "y"]), out.state, "second")
    assert out.checkpoint == {"position": "after_model", "cycle_index": 0, "schema_version": "1.0"}


@pytest.mark.parametrize("bad", [None, 42, {}, {"text": "hi"}, [], [1], [{}], [{"role": "user"}]])
async def test_inputs_of_no_known_shape_are_invalid(bad: Any) -> None:
    with pytest.raises(InvalidInputError) as info:
        await invoke(make_agent(["x"]), new_state(), bad)
    assert info.value.code == "invalid_command"


async def test_prompt_as_content_blocks_and_as_messages() -> None:
    out = await invoke(make_agent(["a"]), new_state(), [{"text": "one"}, {"text": "two"}])
    assert out.state.messages[0] == {"role": "user", "content": [{"text": "one"}, {"text": "two"}]}
    messages = [
        {"role": "user", "content": [{"text": "earlier"}]},
        {"role": "assistant", "content": [{"text": "reply"}]},
        {"role": "user", "content": [{"text": "now"}]},
    ]
    out = await invoke(make_agent(["b"], mode="sequential"), new_state(), messages)
    assert out.state.messages[:3] == messages
    check_history(out.state)


async def test_model_error_ends_with_error_and_a_resumable_state() -> None:
    failing = ModelError("upstream 503", retryable=True)
    agent = make_agent([call("echo", text="a"), failing])
    out = await invoke(agent, new_state(), "go")
    out = await invoke(agent, out.state, resume(out))
    paused = out
    out = await invoke(agent, paused.state, resume(paused))
    assert out.stop == "error"
    assert out.result.error is not None and out.result.error.code == "model_error"
    check_history(out.state)
    # the after_tools pause is still the session's pause: the same resume may be retried
    assert out.state.checkpoint == paused.result.checkpoint
    retry = make_agent([call("echo", text="a"), "recovered"])
    out = await invoke(retry, roundtrip(out.state), resume(paused))
    assert out.stop == "end_turn" and texts(out.result.message or {}) == ["recovered"]


async def test_model_error_on_a_prompt_leaves_history_ending_with_the_prompt() -> None:
    agent = make_agent([ModelError("down")], checkpointing=False)
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "error" and out.result.message is None
    assert out.state.messages[-1]["role"] == "user"
    out = await invoke(make_agent(["fine"]), out.state, "again")
    check_history(out.state)
    assert texts(out.state.messages[0]) == ["go", "again"]


async def test_given_state_is_never_mutated() -> None:
    agent = make_agent(TWO_CYCLES, checkpointing=False)
    state = new_state()
    before = roundtrip(state)
    await invoke(agent, state, "compute")
    assert state == before
    agent = make_agent(TWO_CYCLES)
    first = await invoke(agent, new_state(), "compute")
    snapshot = roundtrip(first.state)
    await invoke(agent, first.state, resume(first))
    assert first.state == snapshot


async def test_events_order_for_a_tool_cycle() -> None:
    agent = make_agent([call("echo", text="a"), "done"], checkpointing=False)
    out = await invoke(agent, new_state(), "go")
    kinds = [type(e).__name__ for e in out.events]
    assert kinds == [
        "ModelMessage",
        "Boundary",
        "ToolStarted",
        "ToolFinished",
        "Boundary",
        "ModelTextDelta",
        "ModelMessage",
        "Stopped",
    ]
    assert isinstance(out.events[-1], Stopped)
    assert out.of(ModelMessage)[0].message["content"][0]["toolUse"]["name"] == "echo"


def test_checkpoint_dataclass_round_trip() -> None:
    checkpoint = Checkpoint("after_tools", 3)
    assert Checkpoint.from_dict(checkpoint.to_dict()) == checkpoint


_ = (add, approve, echo)


@pytest.mark.parametrize("as_messages", [False, True])
async def test_a_prompt_answering_an_unanswered_call_is_refused_with_nothing_changed(
    as_messages: bool,
) -> None:
    agent = make_agent([call("echo", "t1", text="a"), "bye"])
    paused = await invoke(agent, new_state(), "first")
    assert paused.state.pending is not None
    mine = {"toolResult": {"toolUseId": "t1", "status": "success", "content": [{"text": "mine"}]}}
    blocks: list[dict[str, Any]] = [mine, {"text": "and more"}]
    prompt: Any = [{"role": "user", "content": blocks}] if as_messages else blocks
    # The reference answers t1 ``Tool was interrupted.`` and sends this result too: two results.
    with pytest.raises(InvalidInputError) as info:
        await invoke(make_agent(["never"]), paused.state, prompt)
    assert info.value.code == "invalid_command"
    assert "'t1'" in info.value.message
    # A result for another call, or none, goes on as before.
    other = {"toolResult": {**mine["toolResult"], "toolUseId": "elsewhere"}}
    out = await invoke(make_agent(["fresh"]), paused.state, [other, {"text": "and more"}])
    assert out.stop == "end_turn"
    assert results_of(out.state.messages[2])[0]["content"] == [{"text": "Tool was interrupted."}]
