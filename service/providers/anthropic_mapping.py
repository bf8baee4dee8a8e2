"""Mapping between Converse-shaped messages and Anthropic Messages, both directions.

Guarantee: toolUse/toolResult become tool_use/tool_result blocks with the same ids (results first
in their user message, as the API requires), and a ``citationsContent`` block goes as its text
(as Strands sends it); streamed events are folded into one assistant message in block order,
with input_json deltas joined and parsed once the block is complete, and a text block that
carries citations kept as a ``citationsContent`` block (as Strands keeps it).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from service.agent.errors import ModelError
from service.agent.provider import ToolSpec
from service.agent.types import Message, StopReason, Usage
from service.providers.anthropic_citations import converse_citation
from service.providers.block_reply import BlockReplyBuilder, ToolCalls
from service.providers.content import (
    cited_text,
    image_media_type,
    kept_tool_input,
    parse_tool_input,
    result_text,
    sent_tool_use,
    source_base64,
)

logger = logging.getLogger(__name__)

STOP_REASONS: dict[str, StopReason] = {
    "end_turn": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "stop_sequence": "stop_sequence",
    "refusal": "content_filtered",
}
"""``pause_turn`` is not one: the provider resumes a paused turn (:mod:`.anthropic_pause`)."""

PROMPT_TOO_LONG = "prompt is too long"
"""How the 400 ``invalid_request_error`` of a request beyond the context window begins."""

_SKIPPED_BLOCKS = frozenset({"cachePoint"})


def to_anthropic_tools(specs: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {"name": spec.name, "description": spec.description, "input_schema": spec.input_schema}
        for spec in specs
    ]


def to_anthropic_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in messages:
        role = "assistant" if message.get("role") == "assistant" else "user"
        blocks = _assistant_blocks(message) if role == "assistant" else _user_blocks(message)
        if blocks:
            out.append({"role": role, "content": blocks})
    return out


def _image(image: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": image_media_type(image),
            "data": source_base64(image, "image"),
        },
    }


def _document(document: dict[str, Any]) -> dict[str, Any]:
    if str(document.get("format", "")).lower() != "pdf":
        raise ModelError(f"document format {document.get('format')!r} is not supported (pdf is)")
    block: dict[str, Any] = {
        "type": "document",
        "source": {
            "type": "base64",
            "media_type": "application/pdf",
            "data": source_base64(document, "document"),
        },
    }
    if document.get("name"):
        block["title"] = str(document["name"])
    return block


def _tool_result(result: dict[str, Any]) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    for item in result.get("content", []):
        text = result_text(item)
        if text is not None:
            if text:
                content.append({"type": "text", "text": text})
        elif "image" in item:
            content.append(_image(item["image"]))
        elif "document" in item:
            content.append(_document(item["document"]))
        else:
            raise ModelError(f"tool result content {sorted(item)} is not supported")
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": result["toolUseId"]}
    if content:
        block["content"] = content
    if result.get("status") == "error":
        block["is_error"] = True
    return block


def _user_blocks(message: Message) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    others: list[dict[str, Any]] = []
    for block in message.get("content", []):
        if "toolResult" in block:
            results.append(_tool_result(block["toolResult"]))
        elif "text" in block or "citationsContent" in block:
            if (text := _text_block(block)) is not None:
                others.append(text)
        elif "image" in block:
            others.append(_image(block["image"]))
        elif "document" in block:
            others.append(_document(block["document"]))
        elif not _SKIPPED_BLOCKS.intersection(block):
            raise ModelError(f"content block {sorted(block)} is not supported by anthropic")
    return results + others


def _assistant_blocks(message: Message) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for block in message.get("content", []):
        if "text" in block or "citationsContent" in block:
            if (text := _text_block(block)) is not None:
                out.append(text)
        elif "toolUse" in block:
            tool_use_id, name, tool_input = sent_tool_use(block["toolUse"])
            out.append({"type": "tool_use", "id": tool_use_id, "name": name, "input": tool_input})
        elif "reasoningContent" in block:
            thinking = _thinking_block(block["reasoningContent"])
            if thinking is not None:
                out.append(thinking)
    return out


def _text_block(block: dict[str, Any]) -> dict[str, Any] | None:
    """A text block; cited text goes without its citations, as Strands sends it (Converse
    citations are not Anthropic's). The API refuses empty text, so there is none."""
    text = block["text"] if "text" in block else cited_text(block["citationsContent"])
    return {"type": "text", "text": text} if text else None


def _thinking_block(reasoning: dict[str, Any]) -> dict[str, Any] | None:
    """Thinking goes back only when signed by Anthropic; other providers' reasoning is dropped."""
    if "redactedContent" in reasoning:
        return {"type": "redacted_thinking", "data": reasoning["redactedContent"]}
    text = reasoning.get("reasoningText") or {}
    if text.get("signature"):
        return {
            "type": "thinking",
            "thinking": text.get("text", ""),
            "signature": text["signature"],
        }
    return None


@dataclass(slots=True)
class StreamedBlock:
    kind: str
    start: dict[str, Any]
    """The block as ``content_block_start`` gave it (sent back as it is to resume a turn)."""
    parts: list[str] = field(default_factory=list)
    signature: str = ""
    tool_id: str = ""
    tool_name: str = ""
    data: str = ""
    citations: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class AnthropicReplyBuilder(BlockReplyBuilder):
    """Folds raw Messages stream events into one :class:`ModelReply`."""

    provider = "anthropic"
    stop_event = "message_delta"
    stop_reasons = STOP_REASONS
    tool_kind = "tool_use"

    blocks: dict[int, StreamedBlock] = field(default_factory=dict)
    stop_reason: str | None = None
    usage: Usage = field(default_factory=Usage)
    """Of every call of the reply so far (a paused turn is resumed by further calls)."""
    offset: int = 0
    """Where the blocks of the current call start: each call numbers its blocks from 0."""
    continuations: int = 0
    _earlier: Usage = field(default_factory=Usage)
    _current: Usage = field(default_factory=Usage)

    def add(self, event: Any) -> str | None:
        """Take one stream event; return the text it adds, if any."""
        kind = event.type
        if kind == "message_start":
            self._take_usage(event.message.usage)
        elif kind == "content_block_start":
            self._start(event.index + self.offset, event.content_block)
        elif kind == "content_block_delta":
            return self._delta(event.index + self.offset, event.delta)
        elif kind == "message_delta":
            if event.delta.stop_reason is not None:
                self.stop_reason = event.delta.stop_reason
            if event.usage is not None:
                self._take_usage(event.usage)
        return None

    def next_call(self) -> list[StreamedBlock]:
        """Start taking the events of the call that resumes a paused turn; returns the blocks
        of the paused call."""
        paused = [block for index, block in sorted(self.blocks.items()) if index >= self.offset]
        self.offset = max(self.blocks, default=self.offset - 1) + 1
        self.continuations += 1
        self.stop_reason = None
        self._earlier.add(self._current)
        self._current = Usage()
        return paused

    def _take_usage(self, usage: Any) -> None:
        inputs = [
            getattr(usage, name, None)
            for name in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        ]
        if any(value is not None for value in inputs):
            self._current.input_tokens = sum(value or 0 for value in inputs)
        output = getattr(usage, "output_tokens", None)
        if output is not None:
            self._current.output_tokens = output
        self.usage = Usage(
            self._earlier.input_tokens + self._current.input_tokens,
            self._earlier.output_tokens + self._current.output_tokens,
        )

    def _start(self, index: int, block: Any) -> None:
        kind = block.type
        entry = StreamedBlock(kind=kind, start=_as_dict(block))
        if kind == "text":
            entry.parts.append(block.text or "")
        elif kind == "tool_use":
            entry.tool_id, entry.tool_name = block.id, block.name
        elif kind == "thinking":
            entry.parts.append(block.thinking or "")
            entry.signature = block.signature or ""
        elif kind == "redacted_thinking":
            entry.data = block.data
        self.blocks[index] = entry

    def _delta(self, index: int, delta: Any) -> str | None:
        entry = self.blocks.get(index)
        if entry is None:
            raise ModelError(f"content_block_delta for unknown block {index}")
        kind = delta.type
        if kind == "text_delta":
            entry.parts.append(delta.text)
            return str(delta.text) or None
        if kind == "input_json_delta":
            entry.parts.append(delta.partial_json)
        elif kind == "thinking_delta":
            entry.parts.append(delta.thinking)
        elif kind == "signature_delta":
            entry.signature += delta.signature
        elif kind == "citations_delta":
            entry.citations.append(_as_dict(delta.citation))
        return None

    def _convert(self, block: StreamedBlock, *, tools: ToolCalls) -> dict[str, Any] | None:
        text = "".join(block.parts)
        if block.kind == "text":
            if not text:
                return None
            if block.citations:
                # Kept in Converse form, as Strands' stream keeps them (and Bedrock's replies).
                citations = [converse_citation(raw) for raw in block.citations]
                return {"citationsContent": {"citations": citations, "content": [{"text": text}]}}
            return {"text": text}
        if block.kind == "tool_use":
            tool_input = (
                parse_tool_input(text, block.tool_name) if tools == "run" else kept_tool_input(text)
            )
            return {
                "toolUse": {
                    "toolUseId": block.tool_id,
                    "name": block.tool_name,
                    "input": tool_input,
                }
            }
        if block.kind == "thinking":
            reasoning: dict[str, Any] = {"text": text}
            if block.signature:
                reasoning["signature"] = block.signature
            return {"reasoningContent": {"reasoningText": reasoning}}
        if block.kind == "redacted_thinking":
            return {"reasoningContent": {"redactedContent": block.data}}
        logger.warning("block_type=<%s> | dropping unsupported content block", block.kind)
        return None


def _as_dict(value: Any) -> dict[str, Any]:
    """An SDK model as the JSON object the API sent (fields it left out stay out)."""
    dump = getattr(value, "model_dump", None)
    if dump is not None:
        return dict(dump(mode="json", exclude_none=True))
    return dict(value) if isinstance(value, dict) else dict(vars(value))
