"""Property test: random sequences of prompts, resumes, answers and cancels keep every invariant.

After every step: each toolUse has exactly one toolResult (except a pending batch), roles never
repeat, the state round-trips through the codec unchanged, and every rejection is a documented
EngineError that changed nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

from engine_helpers import TOOLS, answers, check_history, invoke, resume, roundtrip
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.agent.cancel import CancelSignal
from service.agent.definition import AgentDefinition
from service.agent.errors import (
    CheckpointIncompatibleError,
    CheckpointingDisabledError,
    CheckpointStaleError,
    EngineError,
    InterruptPendingError,
    InvalidInputError,
    NoPendingInterruptError,
    UnknownInterruptError,
)
from service.agent.loop import resolve_cancel
from service.agent.provider import ModelRequest
from service.agent.state import SessionState
from service.providers.scripted import ReplySpec, ScriptedModel, ToolCall

DOCUMENTED = (
    InvalidInputError,
    CheckpointIncompatibleError,
    CheckpointStaleError,
    CheckpointingDisabledError,
    InterruptPendingError,
    NoPendingInterruptError,
    UnknownInterruptError,
)

REPLY_KINDS: dict[str, list[ToolCall] | str] = {
    "text": "plain answer",
    "echo": [ToolCall("echo", {"text": "x"})],
    "ask": [ToolCall("approve", {"action": "a"})],
    "mixed": [ToolCall("echo", {"text": "y"}), ToolCall("approve", {"action": "b"})],
    "two_asks": [ToolCall("approve", {"action": "c"}), ToolCall("approve", {"action": "d"})],
}

MALFORMED: list[Any] = [
    {"checkpointResume": None},
    {"checkpointResume": {}},
    [{"checkpointResume": {"checkpoint": {}}}],
    {"checkpointResume": {"checkpoint": {"position": "after_model", "cycle_index": 0}}},
    {
        "checkpointResume": {
            "checkpoint": {"position": "x", "cycle_index": 0, "schema_version": "1.0"}
        }
    },
    {
        "checkpointResume": {
            "checkpoint": {"position": "after_tools", "cycle_index": 0, "schema_version": 1.0}
        }
    },
]

actions = st.one_of(
    st.tuples(st.just("prompt"), st.text(min_size=1, max_size=5)),
    st.tuples(st.just("resume"), st.none()),
    st.tuples(
        st.just("stale"),
        st.tuples(st.sampled_from(["after_model", "after_tools"]), st.integers(0, 4)),
    ),
    st.tuples(st.just("malformed"), st.sampled_from(MALFORMED)),
    st.tuples(st.just("answer"), st.lists(st.one_of(st.none(), st.text(max_size=3)), max_size=3)),
    st.tuples(st.just("unknown_answer"), st.none()),
    st.tuples(st.just("cancel_next"), st.booleans()),
    st.tuples(st.just("resolve_cancel"), st.none()),
)


def make(kinds: list[str], checkpointing: bool, executor: str) -> AgentDefinition:
    def responder(request: ModelRequest, index: int) -> ReplySpec:
        return REPLY_KINDS[kinds[index]] if index < len(kinds) else "final"  # type: ignore[return-value]

    return AgentDefinition(
        name="prop",
        model=ScriptedModel(responder, mode="conversation"),
        tools=TOOLS,
        executor=executor,  # type: ignore[arg-type]
        checkpointing=checkpointing,
    )


def check(state: SessionState) -> None:
    check_history(state)
    assert roundtrip(state) == state
    assert state.inflight is None


async def drive(agent: AgentDefinition, steps: list[tuple[str, Any]]) -> None:
    state = SessionState(session_id="prop")
    cancel: CancelSignal | None = None
    for kind, arg in steps:
        if kind == "cancel_next":
            cancel = CancelSignal()
            cancel.cancel(after_current_tools=arg)
            continue
        if kind == "resolve_cancel":
            _, state = resolve_cancel(state)
            assert state.pending is None and state.checkpoint is None
            check(state)
            continue
        payload: Any
        if kind == "prompt":
            payload = arg
        elif kind == "resume":
            if state.checkpoint is None:
                continue
            payload = resume(state.checkpoint.to_dict())
        elif kind == "stale":
            checkpoint = {"position": arg[0], "cycle_index": arg[1], "schema_version": "1.0"}
            if state.checkpoint is not None and state.checkpoint.to_dict() == checkpoint:
                continue
            payload = resume(checkpoint)
        elif kind == "malformed":
            payload = arg
        elif kind == "answer":
            pending = [i.id for i in state.pending.interrupts] if state.pending else []
            if not pending:
                payload = answers(("v1:tool_call:none:none", "x"))
            else:
                payload = answers(*zip(pending, arg or [None], strict=False))
        else:
            payload = answers(("v1:tool_call:unknown:id", "x"))
        before = roundtrip(state)
        used_cancel, cancel = cancel, None
        try:
            out = await invoke(agent, state, payload, cancel=used_cancel)
        except EngineError as error:
            assert isinstance(error, DOCUMENTED), f"undocumented rejection {error!r}"
            assert state == before, "a rejection changed the state"
            if kind == "resume":
                raise AssertionError(f"a valid resume was rejected: {error!r}") from error
            if kind in ("stale", "malformed") and not state.interrupted:
                assert isinstance(
                    error,
                    CheckpointStaleError | CheckpointIncompatibleError | CheckpointingDisabledError,
                )
            continue
        assert kind in ("prompt", "resume", "answer"), f"{kind} should have been rejected"
        state = out.state
        check(state)
        if out.stop == "interrupt":
            assert state.interrupted and out.result.interrupts
        else:
            assert not state.interrupted
        if out.stop == "checkpoint":
            assert state.checkpoint == out.result.checkpoint
        else:
            assert state.checkpoint is None
        if used_cancel is not None and used_cancel.immediate:
            assert out.stop == "cancelled"
        elif used_cancel is not None:
            # A deferred cancel that never meets a tool batch is a no-op (as in the reference).
            assert out.stop in ("cancelled", "end_turn")


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    kinds=st.lists(st.sampled_from(sorted(REPLY_KINDS)), min_size=0, max_size=4),
    checkpointing=st.booleans(),
    executor=st.sampled_from(["sequential", "concurrent"]),
    steps=st.lists(actions, min_size=1, max_size=14),
)
def test_random_sequences_keep_the_invariants(
    kinds: list[str], checkpointing: bool, executor: str, steps: list[tuple[str, Any]]
) -> None:
    asyncio.run(drive(make(kinds, checkpointing, executor), steps))
