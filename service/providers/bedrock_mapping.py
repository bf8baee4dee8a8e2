"""Mapping between Cairn's messages and Bedrock ConverseStream, both directions.

Guarantee: Cairn's messages already are Converse messages, so blocks go out as they are except
that empty text is dropped, binary payloads become bytes, a toolUse gets a valid name and an
object input (:func:`.content.sent_tool_use`), a toolResult without content gets one empty text,
its ``status`` goes only to the models that take it (:func:`sends_tool_result_status`) and its
JSON goes as text to the models that misread it (:func:`sends_json_as_text`), and reasoning the
model would refuse is left out (:func:`refuses_reasoning`).
Streamed events are folded into one assistant message in block order, tool input joined and
parsed once its block is complete, and a text block that carries citations kept as a
``citationsContent`` block (as Strands keeps it).
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from service.agent.errors import ModelError
from service.agent.provider import ToolSpec
from service.agent.types import Message, StopReason, Usage
from service.providers.block_reply import BlockReplyBuilder, ToolCalls
from service.providers.content import (
    json_text,
    kept_tool_input,
    parse_tool_input,
    sent_tool_use,
)

logger = logging.getLogger(__name__)

STOP_REASONS: dict[str, StopReason] = {
    "end_turn": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "stop_sequence": "stop_sequence",
    "guardrail_intervened": "guardrail_intervened",
    "content_filtered": "content_filtered",
}

OVERFLOW_MESSAGES = (
    "input is too long",
    "input length and `max_tokens` exceed context limit",
    "too many total text bytes",
    "prompt is too long",
)
"""How a ValidationException of a request beyond the model's context window reads (lowercase
parts; the wording depends on the model family)."""

CACHE_POINT: dict[str, Any] = {"cachePoint": {"type": "default"}}

_STATUS_MODELS = ("anthropic.claude",)
_JSON_AS_TEXT_MODELS = ("amazon.nova",)
_NO_REASONING_TEXT_MODELS = (
    "amazon.nova-lite",
    "amazon.nova-pro",
    "google.gemma",
    "meta.llama",
    "mistral.devstral",
    "mistral.ministral",
    "mistral.mistral-large",
    "nvidia.nemotron-nano-9b",
    "nvidia.nemotron-super",
    "openai.gpt-5",
    "openai.gpt-6",
    "qwen.qwen3-235b",
    "qwen.qwen3-coder",
    "writer.palmyra",
    "xai.grok",
)
"""Models that refuse reasoning text in a request's history ("User messages cannot contain
reasoning content"), as Strands lists them."""
EMPTY_TEXT: dict[str, Any] = {"text": ""}
_PASSED_BLOCKS = frozenset({"cachePoint", "guardContent", "citationsContent"})
_BINARY_BLOCKS = ("image", "document", "video")


def to_bedrock_tools(specs: Sequence[ToolSpec], *, cache: bool) -> dict[str, Any]:
    tools: list[dict[str, Any]] = [
        {
            "toolSpec": {
                "name": spec.name,
                "description": spec.description,
                "inputSchema": {"json": spec.input_schema},
            }
        }
        for spec in specs
    ]
    if cache:
        tools.append(CACHE_POINT)
    return {"tools": tools}


def to_bedrock_system(prompt: str, *, cache: bool) -> list[dict[str, Any]]:
    return [{"text": prompt}, CACHE_POINT] if cache else [{"text": prompt}]


def sends_tool_result_status(model_id: str) -> bool:
    """Whether a toolResult's ``status`` goes to this model: Converse takes it from Anthropic's
    Claude models, and other models may refuse a request that has it. The rule is Strands'
    BedrockModel default (``include_tool_result_status="auto"``)."""
    return any(name in model_id for name in _STATUS_MODELS)


def sends_json_as_text(model_id: str) -> bool:
    """Whether a toolResult's ``json`` content goes to this model as its text: Amazon's Nova
    models invent content when a result holds JSON blocks. The rule is Strands' BedrockModel's
    (``amazon.nova`` anywhere in the id, so inference profiles count too)."""
    return any(name in model_id for name in _JSON_AS_TEXT_MODELS)


def refuses_reasoning(model_id: str, reasoning: dict[str, Any]) -> bool:
    """Whether this model refuses a request whose history holds this reasoning block, so that it
    is left out (Strands' BedrockModel leaves out the same): a signature is Anthropic's, which
    refuses reasoning text without one and the others with one; some models refuse reasoning
    text altogether, DeepSeek any reasoning. A model id naming no vendor keeps everything."""
    model = model_id.lower()
    if "deepseek" in model:
        return True
    if "reasoningText" not in reasoning:
        return False
    signed = bool((reasoning.get("reasoningText") or {}).get("signature"))
    if "anthropic" in model or "claude" in model:
        return not signed
    if model.startswith("arn:") or "." not in model:
        return False
    if any(name in model for name in _NO_REASONING_TEXT_MODELS):
        return True
    return signed


def to_bedrock_messages(
    messages: Sequence[Message], *, model_id: str | None = None
) -> list[dict[str, Any]]:
    """Converse messages for ``model_id``; None for none of the per-model rules."""
    status = model_id is None or sends_tool_result_status(model_id)
    json_as_text = model_id is not None and sends_json_as_text(model_id)
    out: list[dict[str, Any]] = []
    for message in messages:
        role = "assistant" if message.get("role") == "assistant" else "user"
        blocks = []
        for block in message.get("content", []):
            if "toolResult" in block:
                result = _tool_result(block["toolResult"], status, json_as_text)
                blocks.append({"toolResult": result})
            elif (
                model_id is not None
                and "reasoningContent" in block
                and refuses_reasoning(model_id, block["reasoningContent"])
            ):
                continue
            elif (converted := _block(block)) is not None:
                blocks.append(converted)
        if blocks:
            out.append({"role": role, "content": blocks})
    return out


def _block(block: dict[str, Any]) -> dict[str, Any] | None:
    if "text" in block:
        return {"text": block["text"]} if block["text"] else None
    if "toolUse" in block:
        tool_use_id, name, tool_input = sent_tool_use(block["toolUse"])
        return {"toolUse": {"toolUseId": tool_use_id, "name": name, "input": tool_input}}
    if "reasoningContent" in block:
        return {"reasoningContent": _reasoning(block["reasoningContent"])}
    for kind in _BINARY_BLOCKS:
        if kind in block:
            return {kind: _with_bytes(block[kind], kind)}
    if _PASSED_BLOCKS.intersection(block):
        return block
    raise ModelError(f"content block {sorted(block)} is not supported by bedrock")


def _tool_result(result: dict[str, Any], status: bool, json_as_text: bool) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    for item in result.get("content", []):
        if "json" in item:
            value = item["json"]
            converted: dict[str, Any] | None = (
                {"text": json_text(value, ascii_only=True)} if json_as_text else {"json": value}
            )
        else:
            converted = _block(item)
        if converted is not None:
            content.append(converted)
    # Some models refuse a result without content (Strands sends one empty text instead too).
    out: dict[str, Any] = {"toolUseId": result["toolUseId"], "content": content or [EMPTY_TEXT]}
    if status and result.get("status") in ("success", "error"):
        out["status"] = result["status"]
    return out


def _reasoning(reasoning: dict[str, Any]) -> dict[str, Any]:
    if "redactedContent" in reasoning:
        return {"redactedContent": _as_bytes(reasoning["redactedContent"], "reasoning")}
    return dict(reasoning)


def _with_bytes(block: dict[str, Any], kind: str) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, dict):
        raise ModelError(f"{kind} block has no source")
    if "bytes" not in source:
        return block  # an S3 location goes as it is
    return {**block, "source": {**source, "bytes": _as_bytes(source["bytes"], kind)}}


def _as_bytes(data: Any, kind: str) -> bytes:
    """Raw bytes of a payload the history holds raw or base64-encoded (the codec stores JSON)."""
    if isinstance(data, bytes | bytearray):
        return bytes(data)
    if isinstance(data, str):
        try:
            return base64.b64decode(data, validate=True)
        except binascii.Error as exc:
            raise ModelError(f"{kind} bytes are neither bytes nor base64: {exc}") from None
    raise ModelError(f"{kind} block has no bytes")


@dataclass(slots=True)
class _Block:
    kind: str = "text"
    parts: list[str] = field(default_factory=list)
    signature: str = ""
    redacted: bytes = b""
    tool_id: str = ""
    tool_name: str = ""
    citations: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class BedrockReplyBuilder(BlockReplyBuilder):
    """Folds ConverseStream events (dicts as botocore parses them) into one reply."""

    provider = "bedrock"
    stop_event = "messageStop"
    stop_reasons = STOP_REASONS
    tool_kind = "toolUse"

    blocks: dict[int, _Block] = field(default_factory=dict)
    stop_reason: str | None = None
    usage: Usage = field(default_factory=Usage)

    def add(self, event: Any) -> str | None:
        """Take one stream event; return the text it adds, if any."""
        if "contentBlockStart" in event:
            self._start(event["contentBlockStart"])
        elif "contentBlockDelta" in event:
            return self._delta(event["contentBlockDelta"])
        elif "messageStop" in event:
            self.stop_reason = str(event["messageStop"].get("stopReason", ""))
        elif "metadata" in event:
            self._take_usage(event["metadata"].get("usage") or {})
        return None

    def _start(self, start: dict[str, Any]) -> None:
        entry = self.blocks.setdefault(int(start.get("contentBlockIndex", 0)), _Block())
        use = (start.get("start") or {}).get("toolUse")
        if use is not None:
            entry.kind, entry.tool_id, entry.tool_name = "toolUse", use["toolUseId"], use["name"]

    def _delta(self, event: dict[str, Any]) -> str | None:
        entry = self.blocks.setdefault(int(event.get("contentBlockIndex", 0)), _Block())
        delta = event.get("delta") or {}
        if "text" in delta:
            entry.parts.append(delta["text"])
            return str(delta["text"]) or None
        if "toolUse" in delta:
            entry.parts.append(delta["toolUse"].get("input", ""))
        elif "citation" in delta:
            # Kept as Strands keeps them: the block becomes a citationsContent block, which is
            # also how Converse takes it back on the next call.
            entry.citations.append(dict(delta["citation"]))
        elif "reasoningContent" in delta:
            entry.kind = "reasoning"
            reasoning = delta["reasoningContent"]
            entry.parts.append(reasoning.get("text", ""))
            entry.signature += reasoning.get("signature", "")
            entry.redacted += reasoning.get("redactedContent", b"")
        return None

    def _take_usage(self, usage: dict[str, Any]) -> None:
        # Bedrock counts cached input apart from ``inputTokens``; all of it is input here.
        self.usage.input_tokens = sum(
            int(usage.get(name) or 0)
            for name in ("inputTokens", "cacheReadInputTokens", "cacheWriteInputTokens")
        )
        self.usage.output_tokens = int(usage.get("outputTokens") or 0)

    def _convert(self, block: _Block, *, tools: ToolCalls) -> dict[str, Any] | None:
        text = "".join(block.parts)
        if block.kind == "text":
            if not text:
                return None
            if block.citations:
                cited = {"citations": block.citations, "content": [{"text": text}]}
                return {"citationsContent": cited}
            return {"text": text}
        if block.kind == "toolUse":
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
        if block.redacted:
            encoded = base64.b64encode(block.redacted).decode("ascii")
            return {"reasoningContent": {"redactedContent": encoded}}
        reasoning: dict[str, Any] = {"text": text}
        if block.signature:
            reasoning["signature"] = block.signature
        return {"reasoningContent": {"reasoningText": reasoning}}
