"""Mapping between Converse-shaped messages and the chat-completions format, both directions.

Guarantee: every toolUse of the history reaches the endpoint as a ``tool_calls`` entry and every
toolResult as a ``tool`` message right after it, in order; streamed chunks are folded into one
assistant message whose toolUse blocks carry parsed JSON input. Cited text (a
``citationsContent`` block another provider's reply left in the history) goes as its text, so a
session carries over from Bedrock or Anthropic; Strands' OpenAI model refuses the block.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from service.agent.errors import ModelError
from service.agent.provider import ModelReply, ToolSpec
from service.agent.types import Message, StopReason, Usage
from service.providers.block_reply import warn_unknown
from service.providers.content import (
    cited_text,
    image_media_type,
    json_text,
    kept_tool_input,
    parse_tool_input,
    result_text,
    sent_tool_use,
    source_base64,
)
from service.providers.retry import TruncatedStreamError

logger = logging.getLogger(__name__)

FINISH_REASONS: dict[str, StopReason] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "content_filtered",
}

_SKIPPED_BLOCKS = frozenset({"reasoningContent", "cachePoint"})
"""Blocks the chat format has no place for; dropping them does not change the conversation."""


def to_chat_tools(specs: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": spec.name,
                "description": spec.description,
                "parameters": spec.input_schema,
            },
        }
        for spec in specs
    ]


def to_chat_messages(
    messages: Sequence[Message], system_prompt: str | None, system_role: str = "system"
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if system_prompt:
        out.append({"role": system_role, "content": system_prompt})
    for message in messages:
        if message.get("role") == "assistant":
            out.append(_assistant_message(message))
        else:
            out.extend(_user_messages(message))
    return out


def _image_part(image: dict[str, Any]) -> dict[str, Any]:
    url = f"data:{image_media_type(image)};base64,{source_base64(image, 'image')}"
    return {"type": "image_url", "image_url": {"url": url}}


def _user_messages(message: Message) -> list[dict[str, Any]]:
    """Tool results first (they must follow the assistant's tool_calls), then the user parts."""
    tool_messages: list[dict[str, Any]] = []
    result_images: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for block in message.get("content", []):
        if "toolResult" in block:
            result = block["toolResult"]
            texts: list[str] = []
            for item in result.get("content", []):
                text = result_text(item)
                if text is not None:
                    texts.append(text)
                elif "image" in item:
                    result_images.append(_image_part(item["image"]))
                else:
                    raise ModelError(f"tool result content {sorted(item)} is not supported")
            tool_messages.append(
                {"role": "tool", "tool_call_id": result["toolUseId"], "content": "\n".join(texts)}
            )
        elif "text" in block:
            parts.append({"type": "text", "text": block["text"]})
        elif "citationsContent" in block:
            parts.append({"type": "text", "text": cited_text(block["citationsContent"])})
        elif "image" in block:
            parts.append(_image_part(block["image"]))
        elif not _SKIPPED_BLOCKS.intersection(block):
            raise ModelError(f"content block {sorted(block)} is not supported by chat completions")
    out = tool_messages
    if result_images:
        # tool messages carry text only, so images a tool returned follow as a user message
        out.append(
            {"role": "user", "content": [{"type": "text", "text": "Tool images:"}, *result_images]}
        )
    if parts:
        only_text = all(p["type"] == "text" for p in parts)
        content: Any = "\n".join(p["text"] for p in parts) if only_text else parts
        out.append({"role": "user", "content": content})
    return out


def _assistant_message(message: Message) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message.get("content", []):
        if "text" in block:
            texts.append(block["text"])
        elif "citationsContent" in block:
            # The chat format has no citations; the text is what the model said.
            texts.append(cited_text(block["citationsContent"]))
        elif "toolUse" in block:
            tool_use_id, name, tool_input = sent_tool_use(block["toolUse"])
            calls.append(
                {
                    "id": tool_use_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json_text(tool_input)},
                }
            )
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        out["tool_calls"] = calls
    elif out["content"] is None:
        out["content"] = ""
    return out


@dataclass(slots=True)
class _PendingCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass(slots=True)
class ChatReplyBuilder:
    """Folds ``ChatCompletionChunk``s (choice 0) into one :class:`ModelReply`."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, _PendingCall] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: Usage = field(default_factory=Usage)

    def add(self, chunk: Any) -> str | None:
        """Take one chunk; return the text it adds, if any."""
        if chunk.usage is not None:
            self.usage = Usage(
                input_tokens=chunk.usage.prompt_tokens or 0,
                output_tokens=chunk.usage.completion_tokens or 0,
            )
        if not chunk.choices:
            return None
        choice = chunk.choices[0]
        if choice.finish_reason is not None:
            self.finish_reason = choice.finish_reason
        delta = choice.delta
        if delta is None:
            return None
        for piece in delta.tool_calls or ():
            call = self.calls.setdefault(piece.index, _PendingCall())
            if piece.id:
                call.id = piece.id
            if piece.function is not None:
                if piece.function.name:
                    call.name += piece.function.name
                if piece.function.arguments:
                    call.arguments.append(piece.function.arguments)
        added = (delta.content or "") + (delta.refusal or "")
        if added:
            self.text.append(added)
            return added
        return None

    def partial_text(self) -> str:
        return "".join(self.text)

    def build(self) -> ModelReply:
        if self.finish_reason is None:
            raise TruncatedStreamError("stream ended before the model finished its reply")
        stop_reason = FINISH_REASONS.get(self.finish_reason)
        unknown = None
        if stop_reason is None:
            unknown, stop_reason = self.finish_reason, "end_turn"
            warn_unknown("openai_compat", unknown, len(self.calls))
        content: list[dict[str, Any]] = []
        text = self.partial_text()
        if text:
            content.append({"text": text})
        if self.calls:
            if stop_reason == "end_turn" and unknown is None:
                # some compatible servers report "stop" although the reply holds tool calls
                stop_reason = "tool_use"
            run = stop_reason == "tool_use"
            for index in sorted(self.calls):
                call = self.calls[index]
                if not call.id or not call.name:
                    raise ModelError(f"tool call {index} arrived without id or name")
                raw = "".join(call.arguments)
                # Calls of a reply that stopped otherwise are kept, never run (maybe cut off).
                tool_input = parse_tool_input(raw, call.name) if run else kept_tool_input(raw)
                content.append(
                    {"toolUse": {"toolUseId": call.id, "name": call.name, "input": tool_input}}
                )
        return ModelReply(
            message={"role": "assistant", "content": content},
            stop_reason=stop_reason,
            usage=self.usage,
            unknown_stop_reason=unknown,
        )


CONTEXT_OVERFLOW_CODE = "context_length_exceeded"
_OVERFLOW_TEXT = "maximum context length"
"""What servers that send no code (vLLM, some proxies) say in a 400 for the same failure."""


def is_context_overflow(body: object, status: int) -> bool:
    """Whether an error body is the context-overflow failure: the ``context_length_exceeded``
    code (the SDK gives the ``error`` object as the body), or, from a server that sets no
    code, a 400 whose message names the model's maximum context length."""
    if not isinstance(body, dict):
        return False
    inner = body.get("error")
    error: dict[str, object] = inner if isinstance(inner, dict) else body
    if error.get("code") == CONTEXT_OVERFLOW_CODE:
        return True
    message = error.get("message")
    return status == 400 and isinstance(message, str) and _OVERFLOW_TEXT in message.lower()
