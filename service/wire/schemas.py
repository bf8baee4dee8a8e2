"""JSON Schemas (draft 2020-12) of every message, generated from the wire models.

One schema per message, and one per shape a message carries in a field it leaves open (an
interrupt's ``reason``, an answer's ``response``), named as its file in ``contracts/schemas/``;
the models stay the single source, so a schema can only change when a model does.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from service.wire.commands import (
    CancelCommand,
    DeleteCommand,
    ForkCommand,
    HistoryCommand,
    InvokeCommand,
    ResumeCommand,
)
from service.wire.dlq import DlqHeaders
from service.wire.events import EVENT_TYPES
from service.wire.outcomes import ToolOutcomeAnswer, ToolOutcomeUnknownReason
from service.wire.results import ResultRecord
from service.wire.session_record import SessionStateRecord

DRAFT = "https://json-schema.org/draft/2020-12/schema"
ID_PREFIX = "urn:cairn:contracts:schemas:"

MESSAGE_MODELS: dict[str, type[BaseModel]] = {
    "invoke": InvokeCommand,
    "resume": ResumeCommand,
    "delete": DeleteCommand,
    "history": HistoryCommand,
    "fork": ForkCommand,
    "cancel": CancelCommand,
    "agent_result": ResultRecord,
    **{f"event.{name}": model for name, model in EVENT_TYPES.items()},
    "dlq_headers": DlqHeaders,
    "session_state": SessionStateRecord,
}
"""Schema name -> model; the name is also the example folder and the AsyncAPI message id."""

PART_MODELS: dict[str, type[BaseModel]] = {
    "tool_outcome_unknown_reason": ToolOutcomeUnknownReason,
    "tool_outcome_answer": ToolOutcomeAnswer,
}
"""Schema name -> model of a shape inside a message's open field: the ``reason`` of a
``tool_outcome_unknown`` interrupt and the ``response`` that answers it. Their examples are
inside the message examples that carry them; the AsyncAPI document lists them as schemas."""


def _strip_field_titles(node: Any) -> None:
    # Generated per-field titles ("Cycle Index") add noise for other languages' generators.
    if isinstance(node, dict):
        for prop in (node.get("properties") or {}).values():
            if isinstance(prop, dict):
                prop.pop("title", None)
        for value in node.values():
            _strip_field_titles(value)
    elif isinstance(node, list):
        for value in node:
            _strip_field_titles(value)


def message_schema(name: str) -> dict[str, Any]:
    """The standalone JSON Schema of one message or part (its shared parts under ``$defs``)."""
    model = MESSAGE_MODELS.get(name) or PART_MODELS[name]
    body = model.model_json_schema(by_alias=True, mode="validation")
    _strip_field_titles(body)
    return {"$schema": DRAFT, "$id": f"{ID_PREFIX}{name}", **body}


def all_schemas() -> dict[str, dict[str, Any]]:
    return {name: message_schema(name) for name in (*MESSAGE_MODELS, *PART_MODELS)}
