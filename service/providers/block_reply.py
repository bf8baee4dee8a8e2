"""The part every streaming reply builder shares: from the content blocks and the stop reason a
stream gave, one :class:`ModelReply`.

Guarantee: a stream that ended without a stop reason is a :class:`TruncatedStreamError` (it is
retried); the stop reason of a reply that ran into the end of the context window is a
:class:`ContextOverflowError`; a reply whose stop reason maps to ``end_turn`` but which holds tool
uses is a ``tool_use`` reply, with a warning; a reply with another stop reason keeps its tool uses
(the engine does not run them; their arguments, perhaps cut off, are kept when they parse); an
unknown stop reason ends the turn (``end_turn``, the raw value in ``unknown_stop_reason``), with
a warning that names it and counts the tool uses left unrun.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from service.agent.errors import ContextOverflowError
from service.agent.provider import ModelReply
from service.agent.types import StopReason, Usage
from service.providers.retry import TruncatedStreamError

logger = logging.getLogger(__name__)

CONTEXT_WINDOW_EXCEEDED = "model_context_window_exceeded"

ToolCalls = Literal["run", "keep"]
"""What becomes of a reply's tool calls: run (their arguments must parse), or kept unrun."""


class BlockReplyBuilder:
    """Mixed into a provider's builder, which holds ``blocks``, ``stop_reason`` and ``usage`` and
    converts one of its blocks (``_convert``)."""

    provider: ClassVar[str]
    stop_event: ClassVar[str]
    """The stream event that carries the stop reason (named when a stream ends without it)."""
    stop_reasons: ClassVar[Mapping[str, StopReason]]
    tool_kind: ClassVar[str]
    """The ``kind`` of a block that holds a tool use."""
    blocks: dict[int, Any]
    stop_reason: str | None
    usage: Usage

    def partial_text(self) -> str:
        return "".join("".join(b.parts) for _, b in sorted(self.blocks.items()) if b.kind == "text")

    def build(self) -> ModelReply:
        if self.stop_reason is None:
            raise TruncatedStreamError(f"stream ended before {self.stop_event} gave a stop reason")
        if self.stop_reason == CONTEXT_WINDOW_EXCEEDED:
            # The reply filled what was left of the context window: the request must shrink.
            raise ContextOverflowError(
                f"{self.provider}: stop reason {CONTEXT_WINDOW_EXCEEDED}: the reply reached the "
                "end of the model's context window"
            )
        stop_reason = self.stop_reasons.get(self.stop_reason)
        unknown = None
        if stop_reason is None:
            unknown, stop_reason = self.stop_reason, "end_turn"
            warn_unknown(self.provider, unknown, self._count(self.tool_kind))
        elif stop_reason == "end_turn" and self._count(self.tool_kind):
            # Some models end a turn normally although the reply asks for tools; the calls are
            # complete (nothing cut the reply short), so they run instead of being dropped.
            logger.warning(
                "stop_reason=<%s> | reply holds tool uses, treating it as tool_use",
                self.stop_reason,
            )
            stop_reason = "tool_use"
        content: list[dict[str, Any]] = []
        for _, block in sorted(self.blocks.items()):
            converted = self._convert(block, tools="run" if stop_reason == "tool_use" else "keep")
            if converted is not None:
                content.append(converted)
        return ModelReply(
            message={"role": "assistant", "content": content},
            stop_reason=stop_reason,
            usage=self.usage,
            unknown_stop_reason=unknown,
        )

    def _count(self, kind: str) -> int:
        return sum(block.kind == kind for block in self.blocks.values())

    def _convert(self, block: Any, *, tools: ToolCalls) -> dict[str, Any] | None:
        raise NotImplementedError


def warn_unknown(provider: str, raw: str, tool_calls: int) -> None:
    """Log a stop reason Cairn does not know with its raw value (the model span's finish reason
    has it too): the wire's stop reasons are a closed set, so the result says ``end_turn``."""
    logger.warning(
        "provider=<%s>, stop_reason=<%s>, unrun_tool_calls=<%d> | unknown stop reason, "
        "ending the turn as end_turn; its tool calls are kept in the reply and not run",
        provider,
        raw,
        tool_calls,
    )
