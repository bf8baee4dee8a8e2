"""Cancel of a session outside any invocation: resolves a pending pause with a cancelled result.

The result state keeps the history valid (every pending toolUse gets a result) and makes the
pause it resolved stale.
"""

from __future__ import annotations

from service.agent.cancel import DEFAULT_CANCEL_MESSAGE
from service.agent.messages import append_message, results_message, tool_uses
from service.agent.metrics import InvocationMetrics
from service.agent.results import CANCELLED_TEXT
from service.agent.state import SessionState
from service.agent.types import AgentResult, Message


def resolve_cancel(
    state: SessionState, message: str | None = None
) -> tuple[AgentResult, SessionState]:
    """Cancel a session outside any invocation, resolving its pause if it has one.

    The history ends as a running invocation cancelled at that point would leave it: with a
    batch pending (after_model or interrupt pause) its tools get ``Tool execution cancelled``
    (completed results are kept, and at an interrupt pause a toolUseId with a result gets no
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
        results = results_message(uses, ws.pending.results, CANCELLED_TEXT, answered)
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
