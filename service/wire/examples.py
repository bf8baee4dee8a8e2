"""Example messages of one realistic session, built through the engine types and wire models.

Each example is produced by the same code paths the service uses, so it validates against its
schema and re-encodes unchanged by construction; the contract tests check both independently.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel

from service.agent.context import ContextState
from service.agent.interrupts import tool_call_id
from service.agent.state import PendingBatch, SessionState
from service.agent.types import AgentResult, Checkpoint, ErrorInfo, Interrupt, Usage
from service.sessions.codec import record_dict
from service.sessions.delivery import Delivery
from service.wire.codec import encode
from service.wire.commands import (
    CancelCommand,
    DeleteCommand,
    ForkCommand,
    HistoryCommand,
    InvokeCommand,
    Limits,
    ResumeCommand,
)
from service.wire.dlq import dlq_headers
from service.wire.errors import ErrorCode
from service.wire.events import (
    CheckpointReachedEvent,
    InterruptRaisedEvent,
    ModelMessageEvent,
    SessionExpiredEvent,
    TextDeltaEvent,
    ToolFinishedEvent,
    ToolStartedEvent,
)
from service.wire.outcome_examples import outcome_examples
from service.wire.pauses import CheckpointResume, InterruptAnswer
from service.wire.results import (
    CancelReport,
    deleted_result,
    error_record,
    history_result,
    result_record,
)
from service.wire.session_record import SessionStateRecord

SESSION = "support-4711"
FORK = "support-4711-b"
AGENT = "support"
METADATA = {"tenant": "acme", "request_id": "req-2b1c"}
LOOKUP_ID = "tooluse_lookup_01"
REFUND_ID = "tooluse_refund_02"
APPROVAL = tool_call_id(REFUND_ID, "approve_refund")

USER_TEXT = "Where is order 8812? If it is late, refund the shipping fee."
LOOKUP_MESSAGE: dict[str, Any] = {
    "role": "assistant",
    "content": [
        {"text": "Let me look up order 8812."},
        {
            "toolUse": {
                "toolUseId": LOOKUP_ID,
                "name": "lookup_order",
                "input": {"order_id": "8812"},
            }
        },
    ],
}
LOOKUP_RESULT: dict[str, Any] = {
    "toolResult": {
        "toolUseId": LOOKUP_ID,
        "status": "success",
        "content": [{"json": {"order_id": "8812", "status": "delayed", "shipping_fee": 4.99}}],
    }
}
REFUND_MESSAGE: dict[str, Any] = {
    "role": "assistant",
    "content": [
        {"text": "The order is delayed; I will refund the 4.99 EUR shipping fee."},
        {
            "toolUse": {
                "toolUseId": REFUND_ID,
                "name": "issue_refund",
                "input": {"order_id": "8812", "amount": 4.99, "currency": "EUR"},
            }
        },
    ],
}
FINAL_MESSAGE: dict[str, Any] = {
    "role": "assistant",
    "content": [{"text": "Order 8812 is delayed by two days; the shipping fee was refunded."}],
}
APPROVAL_REASON = {"order_id": "8812", "amount": 4.99, "currency": "EUR"}

ERROR_MESSAGES: dict[ErrorCode, str] = {
    "invalid_command": "prompt: must be text, a list of content blocks, a list of messages, "
    "or a resume payload",
    "unknown_agent": "agent 'billing' is not hosted here",
    "checkpoint_incompatible": "resume.checkpointResume.checkpoint.schema_version: Input should "
    "be '1.0'",
    "checkpoint_stale": "checkpoint is not the pause this session issued last",
    "checkpointing_disabled": "checkpointing is off for this agent",
    "interrupt_pending": "an interrupt is pending: only interrupt answers are accepted",
    "no_pending_interrupt": "no interrupt is pending in this session",
    "unknown_interrupt": "unknown interrupt ids: ['v1:tool_call:x:y']",
    "model_error": "model provider failed: 503 Service Unavailable",
    "context_overflow": "the model's context window is exceeded and the context cannot be "
    "reduced further (strategy sliding_window, 3 messages sent): anthropic: HTTP 400 "
    "invalid_request_error: prompt is too long: 212731 tokens > 200000 maximum",
    "limit_exceeded": "turn deadline of 120.0s passed",
    "tool_aborted": "tool 'lookup_order' (toolUseId 'tooluse_lookup_01') raised SystemExit "
    "(Error: SystemExit - 2), which ends the invocation; its tool calls stay unanswered until "
    "the next prompt answers them 'Tool was interrupted.'",
    "version_unavailable": "version 3 of session 'support-4711' is not kept (never reached, "
    "compacted away or deleted)",
    "session_exists": "session 'support-4711-b' already exists",
    "internal": "internal error; the command was not applied",
}


ENGINE_ERRORS = frozenset({"model_error", "context_overflow", "limit_exceeded", "tool_aborted"})
"""Codes of errors that end a turn the engine ran (their results carry its step's version)."""


def _usage(cycles: int) -> dict[str, int]:
    return Usage(input_tokens=412 * cycles, output_tokens=57 * cycles).to_dict()


def _metrics(cycles: int, tools: dict[str, int], turn_invocations: int) -> dict[str, Any]:
    """This invocation's metrics and plausible turn totals, in the engine's layout."""
    tool_ms = 12.5
    invocation = {
        "cycles": cycles,
        "usage": _usage(cycles),
        "model_ms": 640.5 * cycles,
        "duration_ms": 640.5 * cycles + tool_ms * sum(tools.values()) + 1.25,
        "tools": {
            name: {"calls": calls, "errors": 0, "time_ms": tool_ms * calls}
            for name, calls in tools.items()
        },
    }
    turn_cycles = max(cycles, (turn_invocations + 1) // 2)
    turn = {
        "invocations": turn_invocations,
        "cycles": turn_cycles,
        "usage": _usage(turn_cycles),
        "model_ms": 640.5 * turn_cycles,
        "duration_ms": 655.25 * turn_invocations,
        "tools": invocation["tools"],
    }
    return {"invocation": invocation, "turn": turn}


def _json(model: BaseModel) -> Any:
    return orjson.loads(encode(model))


def _commands() -> dict[str, tuple[str, Any]]:
    checkpoint = Checkpoint(position="after_model", cycle_index=0).to_dict()
    return {
        "invoke/text-prompt": (
            "invoke",
            InvokeCommand(
                command_id="cmd-0001",
                session_id=SESSION,
                agent=AGENT,
                prompt=USER_TEXT,
                checkpointing=True,
                metadata=METADATA,
            ),
        ),
        "invoke/content-blocks-with-limits": (
            "invoke",
            InvokeCommand(
                command_id="cmd-0101",
                session_id="support-4712",
                agent=AGENT,
                prompt=[{"text": "Summarise the open tickets of customer 77."}],
                limits=Limits(max_cycles=8, max_tokens=20000, deadline_s=120.0),
                invocation_state={"customer_id": 77, "locale": "de-DE"},
            ),
        ),
        "invoke/messages": (
            "invoke",
            InvokeCommand(
                command_id="cmd-0201",
                session_id="support-4713",
                agent=AGENT,
                prompt=[
                    {"role": "user", "content": [{"text": "My parcel never arrived."}]},
                    {"role": "assistant", "content": [{"text": "Which order number?"}]},
                    {"role": "user", "content": [{"text": "Order 9120."}]},
                ],
            ),
        ),
        "resume/checkpoint": (
            "resume",
            ResumeCommand(
                command_id="cmd-0002",
                session_id=SESSION,
                resume=CheckpointResume.model_validate(
                    {"checkpointResume": {"checkpoint": checkpoint}}
                ),
                metadata=METADATA,
            ),
        ),
        "resume/interrupt-answers": (
            "resume",
            ResumeCommand(
                command_id="cmd-0005",
                session_id=SESSION,
                resume=[
                    InterruptAnswer.model_validate(
                        {
                            "interruptResponse": {
                                "interruptId": APPROVAL,
                                "response": {"approved": True, "approver": "j.doe"},
                            }
                        }
                    )
                ],
                metadata=METADATA,
            ),
        ),
        "history/newest": (
            "history",
            HistoryCommand(command_id="cmd-0960", session_id=SESSION, limit=2, metadata=METADATA),
        ),
        "history/older-page": (
            "history",
            HistoryCommand(command_id="cmd-0961", session_id=SESSION, limit=2, before=8),
        ),
        "fork/at-version": (
            "fork",
            ForkCommand(
                command_id="cmd-0970",
                session_id=FORK,
                source_session_id=SESSION,
                version=1,
                metadata=METADATA,
            ),
        ),
        "delete/session": (
            "delete",
            DeleteCommand(command_id="cmd-0950", session_id=SESSION, metadata=METADATA),
        ),
        "cancel/session": (
            "cancel",
            CancelCommand(command_id="cmd-0900", session_id=SESSION),
        ),
        "cancel/command-after-current-tools": (
            "cancel",
            CancelCommand(
                command_id="cmd-0901",
                session_id=SESSION,
                target_command_id="cmd-0003",
                message="Stopped by the operator",
                after_current_tools=True,
            ),
        ),
    }


def _results() -> dict[str, tuple[str, Any]]:
    state = {"customer_tier": "gold"}
    results = {
        "agent_result/checkpoint-after-model": (
            "cmd-0001",
            AgentResult(
                stop_reason="checkpoint",
                message=LOOKUP_MESSAGE,
                checkpoint=Checkpoint(position="after_model", cycle_index=0),
                metrics=_metrics(1, {}, 1),
                state=state,
            ),
        ),
        "agent_result/checkpoint-after-tools": (
            "cmd-0002",
            AgentResult(
                stop_reason="checkpoint",
                message=LOOKUP_MESSAGE,
                checkpoint=Checkpoint(position="after_tools", cycle_index=0),
                metrics=_metrics(0, {"lookup_order": 1}, 2),
                state=state,
            ),
        ),
        "agent_result/interrupt": (
            "cmd-0004",
            AgentResult(
                stop_reason="interrupt",
                message=REFUND_MESSAGE,
                interrupts=[Interrupt(id=APPROVAL, name="approve_refund", reason=APPROVAL_REASON)],
                metrics=_metrics(0, {"issue_refund": 1}, 4),
                state=state,
            ),
        ),
        "agent_result/end-turn": (
            "cmd-0006",
            AgentResult(
                stop_reason="end_turn",
                message=FINAL_MESSAGE,
                metrics=_metrics(1, {}, 6),
                state=state,
            ),
        ),
        "agent_result/cancelled": (
            "cmd-0003",
            AgentResult(
                stop_reason="cancelled",
                message={"role": "assistant", "content": [{"text": "Cancelled by user"}]},
                metrics=_metrics(1, {}, 3),
                state=state,
            ),
        ),
    }
    # Each engine result carries the session version its step committed (boundaries that ran
    # on took the versions in between).
    versions = {"cmd-0001": 1, "cmd-0002": 2, "cmd-0003": 4, "cmd-0004": 6, "cmd-0006": 9}
    out: dict[str, tuple[str, Any]] = {
        name: (
            "agent_result",
            result_record(
                result,
                session_id=SESSION,
                command_id=cid,
                metadata=METADATA,
                version=versions[cid],
            ),
        )
        for name, (cid, result) in results.items()
    }
    for code, text in ERROR_MESSAGES.items():
        error = error_record(
            session_id=SESSION, command_id="cmd-0666", code=code, message=text, metadata=METADATA
        )
        if code in ENGINE_ERRORS:
            # It ends a turn the engine ran: a step, with its version (refusals have none).
            error = error.model_copy(update={"version": 7})
        out[f"agent_result/error-{code.replace('_', '-')}"] = ("agent_result", error)
    # The engine's own error results go through result_record like any other result.
    failed = AgentResult(
        stop_reason="error",
        message=None,
        metrics=_metrics(1, {}, 1),
        error=ErrorInfo(code="model_error", message=ERROR_MESSAGES["model_error"]),
    )
    out["agent_result/error-from-engine"] = (
        "agent_result",
        result_record(failed, session_id=SESSION, command_id="cmd-0667", version=7),
    )
    # A cancel's own result says what it covered.
    # It runs no invocation of its own: its metrics are zeros, and it belongs to no turn.
    nothing_run = {**_metrics(0, {}, 0)["invocation"], "duration_ms": 0.005}
    cancel_answer = result_record(
        AgentResult(
            stop_reason="cancelled",
            message=None,
            metrics={"invocation": nothing_run, "turn": {}},
            state=state,
        ),
        session_id=SESSION,
        command_id="cancel-0001",
    )
    out["agent_result/cancel-report"] = (
        "agent_result",
        cancel_answer.model_copy(
            update={"cancel": CancelReport(stopped="cmd-0003", skipped=["cmd-0004"], resolved=None)}
        ),
    )
    # A delete's own result says what it removed: here it stopped the running invocation
    # (answered first, cancelled) and skipped the command queued behind it.
    out["agent_result/deleted"] = (
        "agent_result",
        deleted_result(
            session_id=SESSION,
            command_id="cmd-0950",
            existed=True,
            records=2,
            stopped="cmd-0007",
            skipped=["cmd-0008"],
            metadata=METADATA,
        ),
    )
    # A delete published again (same command_id) after the session was gone finds nothing.
    out["agent_result/deleted-nothing"] = (
        "agent_result",
        deleted_result(
            session_id=SESSION,
            command_id="cmd-0950",
            existed=False,
            records=0,
            stopped=None,
            skipped=[],
            metadata=METADATA,
        ),
    )
    # A history page: the newest two versions, and where the next page starts.
    out["agent_result/history"] = (
        "agent_result",
        history_result(
            session_id=SESSION,
            command_id="cmd-0960",
            versions=[
                {
                    "version": 9,
                    "at": 1767225642.125,
                    "command_id": "cmd-0006",
                    "stop_reason": "end_turn",
                    "cycle_index": 2,
                    "messages": 7,
                },
                {
                    "version": 8,
                    "at": 1767225640.5,
                    "command_id": "cmd-0006",
                    "position": "after_tools",
                    "cycle_index": 1,
                    "messages": 6,
                },
            ],
            next_before=8,
            oldest_kept=1,
            version=9,
            metadata=METADATA,
        ),
    )
    # A fork's first result: at the after_model pause of version 1 of the source, resumable
    # with this checkpoint, its message the tool calls that pause waits on; the fork's own
    # version 1.
    out["agent_result/forked"] = (
        "agent_result",
        result_record(
            AgentResult(
                stop_reason="checkpoint",
                message=LOOKUP_MESSAGE,
                checkpoint=Checkpoint(position="after_model", cycle_index=0),
                state=state,
            ),
            session_id=FORK,
            command_id="cmd-0970",
            metadata=METADATA,
            version=1,
            forked_from=(SESSION, 1),
        ),
    )
    # Metadata too large to echo within the record limit is left out, and flagged.
    out["agent_result/metadata-truncated"] = (
        "agent_result",
        error_record(
            session_id=SESSION,
            command_id="cmd-0668",
            code="internal",
            message="the command's output was refused by the broker: [Error 10] "
            "MessageSizeTooLargeError",
        ).model_copy(update={"metadata_truncated": True}),
    )
    return out


def _events() -> dict[str, tuple[str, Any]]:
    common: dict[str, Any] = {"session_id": SESSION, "command_id": "cmd-0001"}
    return {
        "event.text_delta/text-delta": (
            "event.text_delta",
            TextDeltaEvent(seq=1, text="Let me look up ", version=1, **common),
        ),
        "event.model_message/model-message": (
            "event.model_message",
            ModelMessageEvent.model_validate(
                {**common, "seq": 2, "version": 1, "message": LOOKUP_MESSAGE}
            ),
        ),
        "event.checkpoint_reached/after-model": (
            "event.checkpoint_reached",
            CheckpointReachedEvent(
                seq=3, position="after_model", cycle_index=0, paused=True, version=1, **common
            ),
        ),
        "event.tool_started/tool-started": (
            "event.tool_started",
            ToolStartedEvent(
                seq=4,
                tool_use_id=LOOKUP_ID,
                name="lookup_order",
                version=2,
                session_id=SESSION,
                command_id="cmd-0002",
            ),
        ),
        "event.tool_finished/tool-finished": (
            "event.tool_finished",
            ToolFinishedEvent(
                seq=5,
                tool_use_id=LOOKUP_ID,
                name="lookup_order",
                status="success",
                version=2,
                session_id=SESSION,
                command_id="cmd-0002",
            ),
        ),
        # The refund tool asks for approval: it ends without a result, just before the interrupt.
        "event.tool_finished/interrupted": (
            "event.tool_finished",
            ToolFinishedEvent(
                seq=8,
                tool_use_id=REFUND_ID,
                name="issue_refund",
                status="interrupted",
                version=6,
                session_id=SESSION,
                command_id="cmd-0004",
            ),
        ),
        "event.session_expired/idle": (
            "event.session_expired",
            SessionExpiredEvent(
                seq=12,
                idle_s=86460.5,
                records=11,
                session_id=SESSION,
                command_id="cmd-0005",
            ),
        ),
        "event.interrupt_raised/approval": (
            "event.interrupt_raised",
            InterruptRaisedEvent.model_validate(
                {
                    "session_id": SESSION,
                    "command_id": "cmd-0004",
                    "seq": 9,
                    "version": 6,
                    "interrupts": [
                        Interrupt(
                            id=APPROVAL, name="approve_refund", reason=APPROVAL_REASON
                        ).to_dict()
                    ],
                }
            ),
        ),
    }


def paused_state() -> SessionState:
    """A session paused at the after_model checkpoint of its first cycle."""
    return SessionState(
        session_id=SESSION,
        agent=AGENT,
        messages=[{"role": "user", "content": [{"text": USER_TEXT}]}, LOOKUP_MESSAGE],
        agent_state={"customer_tier": "gold"},
        checkpoint=Checkpoint(position="after_model", cycle_index=0),
        cycle_index=0,
        pending=PendingBatch(assistant_message=LOOKUP_MESSAGE),
        turn_metrics=_metrics(1, {}, 1)["turn"],
        turn_started_at=1767225600.0,
        turn_checkpointing=True,
    )


def interrupted_state() -> SessionState:
    """A session waiting for an answer to the refund approval of its second cycle."""
    return SessionState(
        session_id=SESSION,
        agent=AGENT,
        messages=[
            {"role": "user", "content": [{"text": USER_TEXT}]},
            LOOKUP_MESSAGE,
            {"role": "user", "content": [LOOKUP_RESULT]},
            REFUND_MESSAGE,
        ],
        agent_state={"customer_tier": "gold"},
        cycle_index=1,
        pending=PendingBatch(
            assistant_message=REFUND_MESSAGE,
            interrupts=[Interrupt(id=APPROVAL, name="approve_refund", reason=APPROVAL_REASON)],
        ),
        turn_metrics=_metrics(2, {"lookup_order": 1, "issue_refund": 1}, 4)["turn"],
        turn_started_at=1767225600.0,
        turn_checkpointing=True,
    )


APPLIED_FOUR = ("cmd-0001", "cmd-0002", "cmd-0003", "cmd-0004")


def summarized_state() -> SessionState:
    """The interrupted session of a summarizing agent: the model sees a summary in place of
    the customer's first message, then the rest of the history."""
    state = interrupted_state()
    state.context = ContextState(
        start=1,
        summary=[
            {
                "text": "* The customer asked where order 8812 is and for a refund of the "
                "shipping fee if it is late."
            }
        ],
    )
    return state


def _others() -> dict[str, tuple[str, Any]]:
    headers = dlq_headers(
        [("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")],
        reason="record value is not UTF-8 JSON: unexpected character: line 1 column 1 (char 0)",
        topic="cairn.commands",
        partition=3,
        offset=18211,
    )
    return {
        "dlq_headers/not-json": (
            "dlq_headers",
            {name: (value or b"").decode() for name, value in headers if name.startswith("cairn.")},
        ),
        "session_state/paused-checkpoint": (
            "session_state",
            SessionStateRecord.model_validate(
                record_dict(paused_state(), Delivery(applied=("cmd-0001",)))
            ),
        ),
        "session_state/pending-interrupt": (
            "session_state",
            SessionStateRecord.model_validate(
                record_dict(interrupted_state(), Delivery(applied=APPLIED_FOUR))
            ),
        ),
        "session_state/summarized-context": (
            "session_state",
            SessionStateRecord.model_validate(
                record_dict(summarized_state(), Delivery(applied=APPLIED_FOUR))
            ),
        ),
    }


def all_examples() -> dict[str, tuple[str, Any]]:
    """``"<folder>/<name>" -> (schema name, JSON value)`` for every example file."""
    outcomes = outcome_examples(METADATA, _metrics(0, {}, 1))
    built = {**_commands(), **_results(), **outcomes, **_events(), **_others()}
    return {
        name: (schema, _json(value) if isinstance(value, BaseModel) else value)
        for name, (schema, value) in built.items()
    }
