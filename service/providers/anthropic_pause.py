"""Resuming a turn Anthropic paused (``stop_reason: pause_turn``), as the reference does.

Guarantee: a paused call is followed by one that sends the conversation again with the paused
assistant content appended as it was streamed (server-side tool blocks included), at most
:data:`MAX_PAUSE_TURN_CONTINUATIONS` times per reply; a turn still paused after that is a
:class:`ModelError`. The reply is every call's blocks in order, with their usage summed.
"""

from __future__ import annotations

import logging
from typing import Any

from service.agent.errors import ModelError
from service.providers.anthropic_mapping import AnthropicReplyBuilder, StreamedBlock
from service.providers.content import kept_tool_input

logger = logging.getLogger(__name__)

PAUSE_TURN = "pause_turn"
MAX_PAUSE_TURN_CONTINUATIONS = 10
"""The reference's bound (strands ``_MAX_PAUSE_TURN_CONTINUATIONS``)."""

_TOOL_USE_KINDS = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})


def resumed_turn(params: dict[str, Any], builder: AnthropicReplyBuilder) -> dict[str, Any] | None:
    """The body of the call that resumes a paused turn; None when the turn is not paused."""
    if builder.stop_reason != PAUSE_TURN:
        return None
    if builder.continuations >= MAX_PAUSE_TURN_CONTINUATIONS:
        raise ModelError(
            f"anthropic: server-side tool turn did not complete after "
            f"{builder.continuations} continuations"
        )
    paused = [_as_sent(block) for block in builder.next_call()]
    logger.debug("continuation=<%d> | resuming paused server-side tool turn", builder.continuations)
    return {**params, "messages": [*params["messages"], {"role": "assistant", "content": paused}]}


def _as_sent(block: StreamedBlock) -> dict[str, Any]:
    """A streamed block as the API wants it back: its start with the deltas applied."""
    out = dict(block.start)
    text = "".join(block.parts)
    if block.kind == "text":
        out["text"] = text
        if block.citations:
            out["citations"] = [*out.get("citations", ()), *block.citations]
    elif block.kind in _TOOL_USE_KINDS and text.strip():
        out["input"] = kept_tool_input(text)
    elif block.kind == "thinking":
        out["thinking"] = text
        out["signature"] = block.signature
    return out
