"""Cancel of a session outside any invocation: resolves a pending pause with a cancelled result.

The result state keeps the history valid (every pending toolUse gets a result) and makes the
pause it resolved stale.
"""

from __future__ import annotations

from service.agent.cancel import DEFAULT_CANCEL_MESSAGE
from service.agent.messages import append_message, result_keys, results_message, tool_uses
from service.agent.metrics import InvocationMetrics
from service.agent.outcomes import cancelled_after_start_text, idempotency_key
from service.agent.results import CANCELLED_TEXT, error_result
from service.agent.state import SessionState
from service.agent.types import AgentResult, Message


def resolve_cancel(
    state: SessionState, message: str | None = None
) -> tuple[AgentResult, SessionState]:
    """Cancel a session outside any invocation, resolving its pause if it has one.

    The history ends as a running invocation cancelled at that point would leave it: with a
    batch pending (after_model or interrupt pause) its tools get ``Tool execution cancelled``
    (a ``once`` tool recorded as started, without a result, gets a text saying it may have run;
    completed results are kept, and at an interrupt pause a toolUseId with a result gets no
    more, as a resume would leave it) and only an explicit ``message`` is appended, the result
    carrying the toolUse message otherwise; at an after_tools pause the cancel stands in for
    the next model reply (``message`` or ``Cancelled by user``). The pause becomes stale. A
    session with nothing paused is returned unchanged (with ``message`` None in the result).
    """
    ws = state.snapshot()
    reply: Message | None = None
    if ws.pending is not None:
        assistant = ws.pending.assistant_message
        uses = tool_uses(assistant)
        answered = ws.pending.resume_answered()
        done = dict(ws.pending.results)
        for use, key in zip(uses, result_keys(uses), strict=True):
            tool_use_id = use["toolUseId"]
            if tool_use_id in ws.pending.started and key not in done:
                # A once tool started and never seen to end (its owner died, or the session
                # paused on tool_outcome_unknown): it may have run; the model must not read
                # that it did not.
                text = cancelled_after_start_text(idempotency_key(ws.session_id, tool_use_id))
                done[key] = error_result(tool_use_id, text)
        results = results_message(uses, done, CANCELLED_TEXT, answered)
        append_message(ws.messages, results)
        reply = assistant
        if message is not None:
            reply = append_message(ws.messages, _text(message))
    elif ws.checkpoint is not None or ws.inflight is not None:
        reply = append_message(ws.messages, _text(message or DEFAULT_CANCEL_MESSAGE))
    ws.pending = None
    ws.checkpoint = None
    ws.inflight = None
    result = AgentResult(
        stop_reason="cancelled",
        message=reply,
        metrics={"invocation": InvocationMetrics().to_dict(), "turn": ws.turn_metrics},
        state=ws.agent_state,
    )
    return result, ws


def _text(text: str) -> Message:
    return {"role": "assistant", "content": [{"text": text}]}
