"""Examples of a tool that must not run twice: its ``tool_outcome_unknown`` pause and the answers.

Built through the engine's own functions (:mod:`service.agent.outcomes`) and the wire models, so
the reason is the one the engine writes and every answer is one it accepts.
"""

from __future__ import annotations

from typing import Any

from service.agent.outcomes import OUTCOME_UNKNOWN, outcome_interrupt_id, outcome_reason
from service.agent.types import AgentResult, Interrupt
from service.wire.commands import ResumeCommand
from service.wire.outcomes import ToolOutcomeAnswer
from service.wire.pauses import InterruptAnswer
from service.wire.results import result_record

SESSION = "accounts-3301"
PAY_ID = "tooluse_pay_01"
PAY_INTERRUPT = outcome_interrupt_id(PAY_ID)
PAY_USE: dict[str, Any] = {
    "toolUseId": PAY_ID,
    "name": "pay_invoice",
    "input": {"invoice_id": "INV-2026-0042", "amount": 1250.0, "currency": "EUR"},
}
PAY_MESSAGE: dict[str, Any] = {
    "role": "assistant",
    "content": [
        {"text": "Invoice INV-2026-0042 is due today; I will pay the 1250.00 EUR now."},
        {"toolUse": PAY_USE},
    ],
}
STARTED = {"at": 1767225661.25, "instance": "cairn-7d9f-2:4411"}
"""2026-01-01T00:01:01.25Z, on the instance that stopped while the payment ran."""

ANSWERS: dict[str, tuple[str, dict[str, Any]]] = {
    "tool-outcome-result": (
        "cmd-0302",
        {
            "result": {
                "content": [{"json": {"payment_id": "pay_81f3c2", "status": "settled"}}],
                "status": "success",
            }
        },
    ),
    "tool-outcome-retry": ("cmd-0303", {"retry": True}),
    "tool-outcome-fail": (
        "cmd-0304",
        {"fail": "Payment status unknown (the provider is unreachable); do not pay again."},
    ),
}
"""Resume example name -> (command id, answer): one per answer shape."""


def outcome_examples(
    metadata: dict[str, Any], metrics: dict[str, Any]
) -> dict[str, tuple[str, Any]]:
    """``"<folder>/<name>" -> (schema name, model)``: the pause and one resume per answer."""
    reason = outcome_reason(PAY_USE, STARTED, f"{SESSION}:{PAY_ID}")
    paused = AgentResult(
        stop_reason="interrupt",
        message=PAY_MESSAGE,
        interrupts=[Interrupt(id=PAY_INTERRUPT, name=OUTCOME_UNKNOWN, reason=reason)],
        metrics=metrics,
        state={"account": "acme-gmbh"},
    )
    examples: dict[str, tuple[str, Any]] = {
        "agent_result/interrupt-tool-outcome-unknown": (
            "agent_result",
            result_record(paused, session_id=SESSION, command_id="cmd-0301", metadata=metadata),
        )
    }
    for name, (command_id, answer) in ANSWERS.items():
        ToolOutcomeAnswer.model_validate(answer)
        examples[f"resume/{name}"] = (
            "resume",
            ResumeCommand(
                command_id=command_id,
                session_id=SESSION,
                resume=[
                    InterruptAnswer.model_validate(
                        {"interruptResponse": {"interruptId": PAY_INTERRUPT, "response": answer}}
                    )
                ],
                metadata=metadata,
            ),
        )
    return examples
