"""What a cancel, or a command it covers, is answered with, and what its session's state records.

Guarantees: every function here is pure over the session's state and delivery records as stored,
so a cancel read again after a restart derives the same answer; a cancel's result never resolves
a pause it does not reach (an in-flight command published after the cancel is continued, not
cancelled), and a targeted cancel whose target the session has not read yet answers nothing for
the target now and records it, so the target is answered ``cancelled`` unrun when it is read.
"""

from __future__ import annotations

from collections.abc import Iterable

from service.agent.loop import resolve_cancel
from service.agent.state import SessionState
from service.agent.types import AgentResult
from service.runtime.control import CancelReach, HeldAnswer
from service.sessions.delivery import Delivery
from service.wire.commands import CancelCommand


def plain_cancelled(state: SessionState) -> AgentResult:
    """A ``cancelled`` result that resolves nothing (the session's pause, if any, is kept)."""
    bare = state.snapshot()
    bare.pending = None
    bare.checkpoint = None
    bare.inflight = None
    result, _ = resolve_cancel(bare)
    return result


def untargeted(
    state: SessionState, delivery: Delivery, cancel: CancelCommand, reach: CancelReach
) -> tuple[AgentResult, SessionState, Delivery]:
    """Resolve the session's pause, or close an invocation its owner left at a boundary."""
    inflight = state.inflight
    published = delivery.inflight_published_ms
    if inflight is not None and published is not None and published > reach.timestamp_ms:
        # The in-flight command was published after the cancel (it started before the
        # cancel was read, then its owner died): its redelivery continues it, uncancelled.
        return plain_cancelled(state), state, delivery
    if inflight is not None:
        reach.stopped = reach.stopped or inflight.command_id
    elif state.interrupted:
        reach.resolved = "interrupt"
    elif state.pending is not None or state.checkpoint is not None:
        reach.resolved = "checkpoint"
    result, state = resolve_cancel(state, cancel.message)
    return result, state, delivery.finished(cancel.command_id)


def targeted(
    session_id: str,
    state: SessionState | None,
    delivery: Delivery,
    target: str,
    *,
    deleted_here: bool,
) -> tuple[AgentResult, SessionState | None, Delivery]:
    """A targeted cancel's result, and the state recording its target if not read yet.

    ``deleted_here``: the target is a command of a session this owner deleted since, so it was
    answered (no state remembers it any more).
    """
    result = plain_cancelled(state or SessionState(session_id=session_id))
    answered = (state is not None and delivery.answered(target)) or deleted_here
    if not answered:
        # Not read yet: it may be a command of another session, answered there, so it gets no
        # result now; the session's state records it, and if the session reads it, it is
        # answered cancelled unrun (the one case where a cancel makes a state for a session
        # that had none).
        state = state if state is not None else SessionState(session_id=session_id)
        delivery = delivery.targeting(target)
    return result, state, delivery


def skipped(
    state: SessionState, delivery: Delivery, command_id: str
) -> tuple[AgentResult, SessionState, Delivery]:
    """A covered command's ``cancelled`` result, and the records that say it was answered."""
    inflight = state.inflight
    if inflight is not None and inflight.command_id == command_id:
        # It ran up to a boundary before a crash: close its turn as a cancel there would have.
        result, state = resolve_cancel(state, None)
        return result, state, delivery.finished(command_id)
    return plain_cancelled(state), state, delivery.applying(command_id)


def recording(delivery: Delivery, answers: Iterable[HeldAnswer]) -> Delivery:
    """``delivery`` with every held cancel in ``answers`` recorded as answered, and what the
    untargeted ones cover (so a covered command read by a later owner is still cancelled)."""
    for answer in answers:
        delivery = delivery.applying(answer.cancel.command_id)
        if answer.cancel.target_command_id is None:
            delivery = delivery.covering(answer.reach.timestamp_ms)
    return delivery
