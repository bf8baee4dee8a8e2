"""A model provider that replays canned replies: text, tool calls, streamed chunks, latency, errors.

Deterministic: in ``conversation`` mode the reply is picked from the conversation itself (the
number of assistant messages since the last user text prompt), so one instance serves many
sessions at once and a replay after a crash gets the same reply, with the same toolUseIds.
It counts in what it is sent: once an agent's context window cuts into the current turn, a
``Responder`` that decides from the request (the last tool result, say) replays more faithfully.
It fails loudly (:class:`ScriptExhaustedError`) when asked for more than its script holds.
With a ``context_window`` it refuses, as a real model does, a request of more messages than
that with :class:`ContextOverflowError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from service.agent.errors import ContextOverflowError, ModelError, ScriptExhaustedError
from service.agent.provider import ModelChunk, ModelProvider, ModelReply, ModelRequest, TextDelta
from service.agent.types import ContentBlock, Message, StopReason, Usage


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    input: dict[str, Any] = field(default_factory=dict)
    tool_use_id: str | None = None
    """Default: ``tooluse_<conversation length>_<position>``, unique in a session (the length
    counts the whole conversation, not only the view a context policy shows the model) and the
    same when the call is made again after a crash."""


@dataclass(frozen=True, slots=True)
class ScriptedReply:
    """One model reply; ``error`` is raised (after latency and chunks) instead of replying."""

    text: str | None = None
    tool_calls: Sequence[ToolCall] = ()
    chunks: Sequence[str] | None = None
    """How ``text`` is streamed; default one chunk with the whole text."""
    latency: float = 0.0
    """Seconds before the first chunk; a cancel cuts the wait short."""
    chunk_latency: float = 0.0
    error: ModelError | None = None
    stop_reason: StopReason | None = None
    usage: Usage | None = None
    content: Sequence[ContentBlock] | None = None
    """Raw assistant content (replaces ``text`` and ``tool_calls``)."""


ReplySpec = ScriptedReply | str | ToolCall | Sequence[ToolCall] | ModelError | Message
Responder = Callable[[ModelRequest, int], ReplySpec]


def text(value: str, **options: Any) -> ScriptedReply:
    return ScriptedReply(text=value, **options)


def tool_calls(*calls: ToolCall, **options: Any) -> ScriptedReply:
    return ScriptedReply(tool_calls=calls, **options)


def conversation_index(messages: Sequence[Message]) -> int:
    """Assistant messages since the last user message that carries text (a prompt)."""
    count = 0
    for message in reversed(messages):
        if message.get("role") == "assistant":
            count += 1
        elif any("text" in block for block in message.get("content", ())):
            break
    return count


def _as_reply(spec: ReplySpec) -> ScriptedReply:
    if isinstance(spec, ScriptedReply):
        return spec
    if isinstance(spec, str):
        return ScriptedReply(text=spec)
    if isinstance(spec, ToolCall):
        return ScriptedReply(tool_calls=(spec,))
    if isinstance(spec, ModelError):
        return ScriptedReply(error=spec)
    if isinstance(spec, dict):
        return ScriptedReply(content=list(spec.get("content") or []))
    calls = list(spec)
    if all(isinstance(call, ToolCall) for call in calls):
        return ScriptedReply(tool_calls=tuple(calls))
    raise TypeError(f"unsupported scripted reply: {spec!r}")


class ScriptedModel(ModelProvider):
    """Replays ``script``; ``mode`` picks by call order or by conversation position."""

    def __init__(
        self,
        script: Sequence[ReplySpec] | Responder,
        *,
        mode: Literal["sequential", "conversation"] = "sequential",
        latency: float = 0.0,
        usage: Usage | None = None,
        record: bool = False,
        context_window: int | None = None,
    ) -> None:
        self._script = script
        self.mode = mode
        self.latency = latency
        self.usage = usage if usage is not None else Usage(input_tokens=10, output_tokens=5)
        self.record = record
        self.context_window = context_window
        """Most messages a request may hold; None for no bound."""
        self.calls = 0
        """Model requests opened so far (every mode)."""
        self.requests: list[ModelRequest] = []
        """Requests received, in order, when ``record`` is set."""
        self._cursor = 0

    def _pick(self, request: ModelRequest) -> tuple[ScriptedReply, int]:
        if self.mode == "conversation":
            index = conversation_index(request.messages)
        else:
            index = self._cursor
            self._cursor += 1
        if callable(self._script):
            return _as_reply(self._script(request, index)), index
        if index >= len(self._script):
            raise ScriptExhaustedError(
                f"scripted model asked for reply {index} but its script holds {len(self._script)}"
                f" (session {request.session_id!r})"
            )
        return _as_reply(self._script[index]), index

    def _message(self, reply: ScriptedReply, request: ModelRequest) -> Message:
        if reply.content is not None:
            return {"role": "assistant", "content": list(reply.content)}
        content: list[ContentBlock] = []
        if reply.text:
            content.append({"text": reply.text})
        position = request.conversation_length
        if position is None:
            position = len(request.messages)
        for n, call in enumerate(reply.tool_calls):
            tool_use_id = call.tool_use_id or f"tooluse_{position}_{n}"
            content.append(
                {
                    "toolUse": {
                        "toolUseId": tool_use_id,
                        "name": call.name,
                        "input": dict(call.input),
                    }
                }
            )
        return {"role": "assistant", "content": content}

    @staticmethod
    async def _pause(seconds: float, request: ModelRequest) -> None:
        if seconds <= 0:
            return
        try:
            await asyncio.wait_for(request.cancel.wait(), seconds)
        except TimeoutError:
            pass

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        self.calls += 1
        if self.record:
            self.requests.append(request)
        window = self.context_window
        if window is not None and len(request.messages) > window:
            raise ContextOverflowError(
                f"scripted: {len(request.messages)} messages exceed the context window of {window}"
            )
        reply, _ = self._pick(request)
        await self._pause(reply.latency or self.latency, request)
        chunks = reply.chunks if reply.chunks is not None else ([reply.text] if reply.text else [])
        for n, chunk in enumerate(chunks):
            if n and reply.chunk_latency:
                await self._pause(reply.chunk_latency, request)
            yield TextDelta(chunk)
        if reply.error is not None:
            raise reply.error
        message = self._message(reply, request)
        has_tools = any("toolUse" in block for block in message["content"])
        stop_reason: StopReason = reply.stop_reason or ("tool_use" if has_tools else "end_turn")
        usage = reply.usage if reply.usage is not None else self.usage
        yield ModelReply(message, stop_reason, Usage(usage.input_tokens, usage.output_tokens))
