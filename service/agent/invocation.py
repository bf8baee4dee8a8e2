"""The invocation command and its validation into a plan, before anything changes.

:func:`plan` is pure: it reads the session state and raises a documented
:class:`~service.agent.errors.EngineError` for any input it rejects, in the order SEMANTICS.md
gives, so a rejected input leaves no trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from service.agent.definition import AgentDefinition
from service.agent.errors import (
    CheckpointIncompatibleError,
    CheckpointingDisabledError,
    CheckpointStaleError,
    InterruptPendingError,
    InvalidInputError,
    NoPendingInterruptError,
    UnknownInterruptError,
)
from service.agent.messages import asked_tools, prompt_messages, tool_uses
from service.agent.outcomes import answer_problem, is_outcome_interrupt
from service.agent.state import SessionState
from service.agent.types import Checkpoint, Limits, Message


@dataclass(slots=True)
class Invocation:
    """One command for the engine: a prompt, a checkpoint resume or interrupt answers."""

    command_id: str
    input: Any
    checkpointing: bool | None = None
    limits: Limits | None = None
    invocation_state: dict[str, Any] | None = None
    result_max_bytes: int | None = None
    """The largest tool result kept, in bytes of the result block's JSON encoding; a larger
    one is replaced by an error result (``RESULT_TOO_LARGE_TEXT``). None: no limit."""
    instance: str = ""
    """Who runs it (host and process), as the ledger of ``once`` tools records it."""


Step = Literal["model", "tools"]


@dataclass(slots=True)
class Plan:
    kind: Literal["prompt", "resume", "answers", "recover"]
    start: Step
    cycle_index: int
    checkpointing: bool
    limits: Limits
    prompt: list[Message] = field(default_factory=list)
    checkpoint: Checkpoint | None = None
    answers: dict[str, Any] = field(default_factory=dict)


def _is_checkpoint_resume(value: Any) -> bool:
    if isinstance(value, dict):
        return "checkpointResume" in value
    return isinstance(value, list) and any(
        isinstance(item, dict) and "checkpointResume" in item for item in value
    )


def _is_answers(value: Any) -> bool:
    return isinstance(value, list) and any(
        isinstance(item, dict) and "interruptResponse" in item for item in value
    )


def _check_prompt(value: Any) -> list[Message]:
    if isinstance(value, str):
        return prompt_messages(value)
    if not isinstance(value, list) or not value:
        raise InvalidInputError("input must be text, content blocks, messages or a resume")
    if not all(isinstance(item, dict) and item for item in value):
        raise InvalidInputError("every content block or message must be a non-empty object")
    with_role = sum(1 for item in value if "role" in item)
    if with_role == len(value):
        for message in value:
            if message["role"] not in ("user", "assistant") or not isinstance(
                message.get("content"), list
            ):
                raise InvalidInputError(
                    "a message needs a role (user|assistant) and a content list"
                )
    elif with_role:
        raise InvalidInputError("input mixes messages and content blocks")
    return prompt_messages(value)


def _check_results(state: SessionState, prompt: list[Message]) -> None:
    """Refuse a prompt holding a toolResult for a tool call the session left unanswered.

    A prompt first answers those calls ``Tool was interrupted.`` (as the reference does), so
    such a call would get two results, which model providers refuse (the reference sends both).
    Only the prompt's user messages before its first assistant message can answer those calls.
    """
    last = state.pending.assistant_message if state.pending is not None else None
    if last is None:
        last = asked_tools(state.messages)
    if last is None:
        return
    unanswered = {use.get("toolUseId") for use in tool_uses(last)}
    for message in prompt:
        if message["role"] != "user":
            return
        for block in message["content"]:
            result = block.get("toolResult") if isinstance(block, dict) else None
            tool_use_id = result.get("toolUseId") if isinstance(result, dict) else None
            if isinstance(tool_use_id, str) and tool_use_id in unanswered:
                raise InvalidInputError(
                    f"the prompt holds a toolResult for toolUseId {tool_use_id!r}, a tool call "
                    "the session left unanswered, which a prompt answers 'Tool was interrupted.'"
                    " (it would have two results): resume the pause to run it, or leave that "
                    "result out"
                )


def _checkpointing(agent: AgentDefinition, state: SessionState, invocation: Invocation) -> bool:
    if invocation.checkpointing is not None:
        return invocation.checkpointing
    if state.turn_checkpointing is not None:
        return state.turn_checkpointing
    return agent.checkpointing


def _checkpointing_off(agent: AgentDefinition, state: SessionState, invocation: Invocation) -> str:
    """Why a checkpoint resume finds checkpointing off: the setting that decided it (a turn
    keeps the setting it began with, its invoke's or else the agent's)."""
    if invocation.checkpointing is not None:
        return "this resume sets checkpointing to false: a checkpoint resume needs it on"
    if state.turn_checkpointing is not None and agent.checkpointing:
        return "checkpointing is off for this turn (its invoke set it to false)"
    return "checkpointing is off for this agent"


def _limits(agent: AgentDefinition, state: SessionState, invocation: Invocation) -> Limits:
    if invocation.limits is not None:
        return invocation.limits
    if state.turn_limits is not None:
        return Limits.from_dict(state.turn_limits)
    return agent.limits


def _plan_resume(agent: AgentDefinition, state: SessionState, invocation: Invocation) -> Plan:
    if state.interrupted:
        raise InterruptPendingError("an interrupt is pending: only interrupt answers are accepted")
    if not _checkpointing(agent, state, invocation):
        raise CheckpointingDisabledError(_checkpointing_off(agent, state, invocation))
    payload = invocation.input
    if not isinstance(payload, dict):
        raise CheckpointIncompatibleError("checkpoint resume must be an object, not a list")
    inner = payload["checkpointResume"]
    if not isinstance(inner, dict) or "checkpoint" not in inner:
        raise CheckpointIncompatibleError("checkpointResume must be an object with a checkpoint")
    checkpoint = Checkpoint.from_dict(inner["checkpoint"])
    if checkpoint != state.checkpoint:
        raise CheckpointStaleError("checkpoint is not the pause this session issued last")
    if checkpoint.position == "after_model":
        start: Step = "tools"
        cycle = checkpoint.cycle_index
    else:
        start, cycle = "model", checkpoint.cycle_index + 1
    return Plan(
        kind="resume",
        start=start,
        cycle_index=cycle,
        checkpointing=True,
        limits=_limits(agent, state, invocation),
        checkpoint=checkpoint,
    )


def _plan_answers(agent: AgentDefinition, state: SessionState, invocation: Invocation) -> Plan:
    answers: dict[str, Any] = {}
    for item in invocation.input:
        body = item.get("interruptResponse") if isinstance(item, dict) else None
        if (
            not isinstance(body, dict)
            or len(item) != 1
            or not isinstance(body.get("interruptId"), str)
            or "response" not in body
        ):
            raise InvalidInputError(
                "each answer must be {'interruptResponse': {'interruptId': str, 'response': ...}}"
            )
        answers[body["interruptId"]] = body["response"]
    if not state.interrupted or state.pending is None:
        raise NoPendingInterruptError("no interrupt is pending in this session")
    known = {i.id for i in state.pending.interrupts}
    unknown = sorted(set(answers) - known)
    if unknown:
        raise UnknownInterruptError(f"unknown interrupt ids: {unknown}")
    for interrupt_id, response in answers.items():
        problem = answer_problem(response) if is_outcome_interrupt(interrupt_id) else None
        if problem is not None:
            raise InvalidInputError(f"interrupt {interrupt_id}: {problem}")
    return Plan(
        kind="answers",
        start="tools",
        cycle_index=state.cycle_index,
        checkpointing=_checkpointing(agent, state, invocation),
        limits=_limits(agent, state, invocation),
        answers=answers,
    )


def plan(agent: AgentDefinition, state: SessionState, invocation: Invocation) -> Plan:
    """Validate ``invocation`` against ``state``; raise an EngineError or say where to start."""
    inflight = state.inflight
    if (
        inflight is not None
        and invocation.command_id
        and inflight.command_id == invocation.command_id
    ):
        after_model = inflight.position == "after_model"
        return Plan(
            kind="recover",
            start="tools" if after_model else "model",
            cycle_index=inflight.cycle_index if after_model else inflight.cycle_index + 1,
            checkpointing=inflight.checkpointing,
            limits=_limits(agent, state, invocation),
        )
    value = invocation.input
    if _is_checkpoint_resume(value):
        return _plan_resume(agent, state, invocation)
    if _is_answers(value):
        return _plan_answers(agent, state, invocation)
    if value is None or isinstance(value, dict):
        raise InvalidInputError("input must be text, content blocks, messages or a resume")
    messages = _check_prompt(value)
    if state.interrupted:
        raise InterruptPendingError("an interrupt is pending: only interrupt answers are accepted")
    _check_results(state, messages)
    return Plan(
        kind="prompt",
        start="model",
        cycle_index=0,
        checkpointing=invocation.checkpointing
        if invocation.checkpointing is not None
        else agent.checkpointing,
        limits=invocation.limits if invocation.limits is not None else agent.limits,
        prompt=messages,
    )
