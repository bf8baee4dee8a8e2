"""The engine's tracing seam: one span around each model call and each tool call.

Guarantees: the engine opens one span around each model call (from the request to its reply,
failure or cancel) and one around each tool call (its retries included), in the caller's
context, so both nest under whatever span the caller has open; a span always ends, also when
the invocation is closed midway. The default tracer does nothing. Nothing here imports
OpenTelemetry; ``service.observability.tracing`` adapts it to this seam.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:
    from service.agent.errors import ModelError
    from service.agent.provider import ModelReply
    from service.agent.types import AgentResult, ContentBlock

AttributeValue = str | int | float | bool | tuple[str, ...]
Attributes = Mapping[str, AttributeValue]

# Names from OpenTelemetry's semantic conventions for generative AI, so tracing back ends
# recognise the spans; the rest are Cairn's own.
OPERATION: Final = "gen_ai.operation.name"
REQUEST_MODEL: Final = "gen_ai.request.model"
FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
TOOL_NAME: Final = "gen_ai.tool.name"
TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
SESSION_ID: Final = "cairn.session_id"
COMMAND_ID: Final = "cairn.command_id"
COMMAND_TYPE: Final = "cairn.command.type"
AGENT: Final = "cairn.agent"
STOP_REASON: Final = "cairn.stop_reason"
ERROR_CODE: Final = "cairn.error.code"
TOOL_STATUS: Final = "cairn.tool.status"
TOOL_ATTEMPTS: Final = "cairn.tool.attempts"
MODEL_OUTCOME: Final = "cairn.model.outcome"


class Span(Protocol):
    """An open span: attributes may be added until it ends."""

    def set(self, key: str, value: AttributeValue) -> None: ...

    def failed(self, description: str, error: BaseException | None = None) -> None:
        """Mark the span's outcome as an error (with the exception, when there is one)."""


class Tracer(Protocol):
    def span(self, name: str, attributes: Attributes) -> AbstractContextManager[Span]:
        """A span that is the current one while the block runs and ends with it."""


class _NoSpan:
    __slots__ = ()

    def set(self, key: str, value: AttributeValue) -> None:
        del key, value

    def failed(self, description: str, error: BaseException | None = None) -> None:
        del description, error


class _NoTracer:
    __slots__ = ()

    def span(self, name: str, attributes: Attributes) -> AbstractContextManager[Span]:
        del name, attributes
        return nullcontext(NO_SPAN)


NO_SPAN: Final[Span] = _NoSpan()
NO_TRACING: Final[Tracer] = _NoTracer()


def model_span_name(model: str) -> str:
    return f"chat {model}"


def tool_span_name(tool: str) -> str:
    return f"execute_tool {tool}"


def model_call(model: str, session_id: str, agent: str) -> Attributes:
    return {OPERATION: "chat", REQUEST_MODEL: model, SESSION_ID: session_id, AGENT: agent}


def model_outcome(
    span: Span, reply: ModelReply | None, failure: ModelError | None, *, cancelled: bool
) -> None:
    """What the model call ended with: a reply (its stop reason and usage), a cancel or an
    error."""
    if failure is not None:
        span.set(MODEL_OUTCOME, "error")
        span.failed(f"{failure.code}: {failure.message}", failure)
    elif cancelled or reply is None:
        span.set(MODEL_OUTCOME, "cancelled")
    else:
        span.set(MODEL_OUTCOME, "reply")
        span.set(FINISH_REASONS, (reply.unknown_stop_reason or reply.stop_reason,))
        span.set(INPUT_TOKENS, reply.usage.input_tokens)
        span.set(OUTPUT_TOKENS, reply.usage.output_tokens)


def tool_call(tool: str, tool_use_id: str, session_id: str, agent: str) -> Attributes:
    return {
        OPERATION: "execute_tool",
        TOOL_NAME: tool,
        TOOL_CALL_ID: tool_use_id,
        SESSION_ID: session_id,
        AGENT: agent,
    }


def tool_error(block: ContentBlock) -> str:
    """Why a tool call's result has the error status: the result's text, as the model reads it
    (already made safe from exceptions that cannot be printed)."""
    content = block["toolResult"].get("content") or [{}]
    return str(content[0].get("text", "tool result with status error"))


def stopped(span: Span, result: AgentResult) -> None:
    """How the invocation ended, on the span of the command that ran it."""
    span.set(STOP_REASON, result.stop_reason)
    if result.error is not None:
        span.set(ERROR_CODE, result.error.code)
        span.failed(f"{result.error.code}: {result.error.message}")
