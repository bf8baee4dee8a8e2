"""The AsyncAPI 3.0 document of Cairn: six topics, their Kafka bindings, messages and operations.

Self-contained: every message payload and shared shape lives under ``components/schemas`` (the
same schemas as ``contracts/schemas/``), so every ``$ref`` resolves inside the document.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.wire.base import WIRE_SCHEMA_VERSION
from service.wire.dlq import TRACEPARENT
from service.wire.schemas import all_schemas

BINDING_VERSION = "0.5.0"
DEFAULT_PARTITIONS = 12
"""Default partition count N; a deployment picks its own, equal on co-partitioned topics."""

_SESSION_KEY: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "description": "The session id. Every record of a session has it as key, so a session "
    "always lands on the same partition of every co-partitioned topic.",
}
_TRACE_HEADERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        TRACEPARENT: {
            "type": "string",
            "description": "W3C trace context; taken from a command and put on what it causes.",
        }
    },
}


@dataclass(frozen=True, slots=True)
class Topic:
    channel: str
    address: str
    messages: tuple[str, ...]
    description: str
    co_partitioned: bool
    compacted: bool = False


TOPICS = (
    Topic(
        "commands",
        "cairn.commands",
        ("invoke", "resume", "delete", "history", "fork"),
        "Commands from upstream: invoke an agent, resume a paused session, delete a session, "
        "list a session's versions, fork a session from one of them.",
        co_partitioned=True,
    ),
    Topic(
        "control",
        "cairn.control",
        ("cancel",),
        "Cancels; co-partitioned with commands so one instance sees both for a session.",
        co_partitioned=True,
    ),
    Topic(
        "results",
        "cairn.results",
        ("agent_result",),
        "Exactly one agent_result per accepted command (read with isolation.level read_committed).",
        co_partitioned=False,
    ),
    Topic(
        "events",
        "cairn.events",
        (
            "event.text_delta",
            "event.model_message",
            "event.tool_started",
            "event.tool_finished",
            "event.checkpoint_reached",
            "event.interrupt_raised",
            "event.session_expired",
        ),
        "Progress of running invocations with a per-session seq; optional to consume.",
        co_partitioned=False,
    ),
    Topic(
        "sessions",
        "cairn.sessions",
        ("session_state",),
        "Session state, one record per session (latest wins): the source of truth.",
        co_partitioned=True,
        compacted=True,
    ),
    Topic(
        "dlq",
        "cairn.dlq",
        ("dlq_record",),
        "Records that could not be decoded or tied to a session, unchanged, reason in headers.",
        co_partitioned=False,
    ),
)

_MESSAGE_TEXT: dict[str, tuple[str, str]] = {
    "invoke": ("Invoke an agent", "Run the named agent on a prompt in a session."),
    "resume": ("Resume a paused session", "Continue from a checkpoint or answer interrupts."),
    "delete": (
        "Delete a session",
        "Stop what runs or waits for the session and tombstone all of its state; the result "
        "carries a deleted report.",
    ),
    "history": (
        "List a session's versions",
        "One page of the session's versions (one per committed step), newest first; the "
        "result carries it in history.",
    ),
    "fork": (
        "Fork a session",
        "Create session_id from version `version` of source_session_id, which is left "
        "unchanged; keyed by the new session's id. The result carries forked_from.",
    ),
    "cancel": ("Cancel", "Stop a running invocation, resolve a pause or skip a queued command."),
    "agent_result": ("Result of one command", "How the invocation ended, and how to continue."),
    "event.text_delta": ("Model text", "Model text streamed since the previous event."),
    "event.model_message": ("Model message", "A complete assistant message."),
    "event.tool_started": ("Tool started", "A tool of the current batch started."),
    "event.tool_finished": ("Tool finished", "A tool of the current batch finished."),
    "event.checkpoint_reached": ("Boundary reached", "A cycle boundary was made durable."),
    "event.interrupt_raised": ("Interrupt raised", "A tool or hook asks a human."),
    "event.session_expired": (
        "Session expired",
        "The session was idle longer than the deployment's idle TTL and was deleted.",
    ),
    "session_state": (
        "Session state",
        "SessionState as JSON; a value starting with the byte 'z' is that JSON "
        "zlib-compressed (the byte is followed by the zlib stream).",
    ),
    "dlq_record": (
        "Dead-letter record",
        "The original key, value and headers byte for byte, plus Cairn's headers.",
    ),
}


_OUTCOME_NOTE = (
    "An interrupt named `tool_outcome_unknown` (id `v1:tool_outcome_unknown:<toolUseId>`) says "
    "that a tool which must not run twice was started and may or may not have done its work; "
)
_MESSAGE_DESCRIPTIONS: dict[str, str] = {
    "resume": "The `response` of an answer to a `tool_outcome_unknown` interrupt (id "
    "`v1:tool_outcome_unknown:<toolUseId>`) is one of the three shapes of "
    "`#/components/schemas/tool_outcome_answer`; any other is refused with `invalid_command`.",
    "agent_result": _OUTCOME_NOTE
    + "its `reason` is `#/components/schemas/tool_outcome_unknown_reason`.",
    "event.interrupt_raised": _OUTCOME_NOTE
    + "its `reason` is `#/components/schemas/tool_outcome_unknown_reason`.",
    "session_state": "A pending `tool_outcome_unknown` interrupt has the `reason` "
    "`#/components/schemas/tool_outcome_unknown_reason`.",
}
"""Where a message carries a shape of its own in an open field (``components/schemas`` lists
those shapes beside the payloads)."""


def _hoist(schemas: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Move every message's ``$defs`` into one components map and point refs at it."""
    components: dict[str, Any] = {}
    for name, schema in schemas.items():
        body = {k: v for k, v in schema.items() if k not in ("$schema", "$id", "$defs")}
        for def_name, definition in schema.get("$defs", {}).items():
            if components.setdefault(def_name, definition) != definition:
                raise ValueError(f"two different shapes are both named {def_name!r}")
        components[name] = body
    hoisted: dict[str, Any] = _rewrite_refs(components)
    return hoisted


def _rewrite_refs(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            key: (
                value.replace("#/$defs/", "#/components/schemas/")
                if key == "$ref" and isinstance(value, str)
                else _rewrite_refs(value)
            )
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_rewrite_refs(item) for item in node]
    return node


def _message(name: str, examples: dict[str, Any]) -> dict[str, Any]:
    title, summary = _MESSAGE_TEXT[name]
    message: dict[str, Any] = {
        "name": name,
        "title": title,
        "summary": summary,
        "contentType": "application/json",
        **({"description": _MESSAGE_DESCRIPTIONS[name]} if name in _MESSAGE_DESCRIPTIONS else {}),
        "bindings": {"kafka": {"key": _SESSION_KEY, "bindingVersion": BINDING_VERSION}},
    }
    if name == "dlq_record":
        message["contentType"] = "application/octet-stream"
        message["payload"] = {"description": "The original record value, unchanged."}
        message["headers"] = {"$ref": "#/components/schemas/dlq_headers"}
    else:
        message["payload"] = {"$ref": f"#/components/schemas/{name}"}
        message["headers"] = _TRACE_HEADERS
    if name not in ("session_state", "dlq_record"):
        message["correlationId"] = {"$ref": "#/components/correlationIds/command_id"}
    if name == "dlq_record" and "dlq_headers" in examples:
        message["examples"] = [{"name": "not-json", "headers": examples["dlq_headers"]}]
    elif name in examples:
        message["examples"] = [{"name": name.split(".")[-1], "payload": examples[name]}]
    return message


def _channel(topic: Topic, partitions: int) -> dict[str, Any]:
    config: dict[str, Any] = {"cleanup.policy": ["compact" if topic.compacted else "delete"]}
    note = (
        " Co-partitioned with the other of commands, control and sessions (same count N)."
        if topic.co_partitioned
        else ""
    )
    return {
        "address": topic.address,
        "title": topic.channel,
        "description": topic.description + note,
        "messages": {name: {"$ref": f"#/components/messages/{name}"} for name in topic.messages},
        "bindings": {
            "kafka": {
                "topic": topic.address,
                "partitions": partitions,
                "topicConfiguration": config,
                "bindingVersion": BINDING_VERSION,
            }
        },
    }


def _operation(topic: Topic) -> tuple[str, dict[str, Any]]:
    receive = topic.channel in ("commands", "control")
    action = "receive" if receive else "send"
    operation: dict[str, Any] = {
        "action": action,
        "channel": {"$ref": f"#/channels/{topic.channel}"},
        "summary": ("Cairn consumes " if receive else "Cairn produces ") + topic.address,
        "messages": [
            {"$ref": f"#/channels/{topic.channel}/messages/{name}"} for name in topic.messages
        ],
    }
    if receive:
        operation["bindings"] = {
            "kafka": {
                "groupId": {"type": "string", "default": "cairn"},
                "bindingVersion": BINDING_VERSION,
            }
        }
    return f"{action}{topic.channel.capitalize()}", operation


def document(
    examples: dict[str, Any] | None = None, *, partitions: int = DEFAULT_PARTITIONS
) -> dict[str, Any]:
    """The AsyncAPI document; ``examples`` maps a message name to one example payload."""
    shown = examples or {}
    messages = {name: _message(name, shown) for topic in TOPICS for name in topic.messages}
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Cairn",
            "version": f"{WIRE_SCHEMA_VERSION}.0.0",
            "description": "Durable agent execution over Kafka. Every value is UTF-8 JSON "
            "carrying schema_version (the session state may be zlib-compressed); every key is "
            "the session id. See docs/clients.md.",
        },
        "defaultContentType": "application/json",
        "servers": {
            "local": {
                "host": "localhost:9092",
                "protocol": "kafka",
                "description": "The local single-node broker of `make kafka-up`.",
            }
        },
        "channels": {topic.channel: _channel(topic, partitions) for topic in TOPICS},
        "operations": dict(_operation(topic) for topic in TOPICS),
        "components": {
            "messages": messages,
            "schemas": _hoist(all_schemas()),
            "correlationIds": {
                "command_id": {
                    "description": "The command a result or event belongs to.",
                    "location": "$message.payload#/command_id",
                }
            },
        },
    }
