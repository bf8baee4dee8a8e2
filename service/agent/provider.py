"""The model-provider seam: one streaming call per model request, cancel-aware, usage-reporting.

A provider's :meth:`ModelProvider.stream` yields zero or more :class:`TextDelta` and then exactly
one :class:`ModelReply`. The engine observes cancel between chunks and closes the stream early with
``aclose()``; a provider must release its connection in ``finally`` so nothing more is billed.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from service.agent.cancel import CancelSignal
from service.agent.types import Message, StopReason, Usage


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What the model is told about a tool: name, description, JSON schema of its input."""

    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(slots=True)
class ModelRequest:
    messages: list[Message]
    system_prompt: str | None
    tool_specs: list[ToolSpec]
    cancel: CancelSignal
    deadline: float | None = None
    """Absolute ``time.monotonic()`` instant after which retries must stop; None for no bound."""
    session_id: str = ""
    conversation_length: int | None = None
    """Messages in the whole conversation when the call is made; ``messages`` holds fewer once
    the agent's context policy cut the view. Never sent to a model: a provider that derives ids
    from where the conversation stands (the scripted one) counts with it."""


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(slots=True)
class ModelReply:
    """The complete assistant message of one model call, with why it stopped and what it cost."""

    message: Message
    stop_reason: StopReason
    usage: Usage = field(default_factory=Usage)
    unknown_stop_reason: str | None = None
    """The provider's own stop reason when Cairn does not know it: ``stop_reason`` is then
    ``end_turn`` and the engine keeps the reply's tool calls without running them."""


ModelChunk = TextDelta | ModelReply


class ModelProvider(abc.ABC):
    """A model endpoint. Raise :class:`service.agent.errors.ModelError` on failure."""

    @property
    def model_name(self) -> str:
        """The model as traces name it: the endpoint's model id, else the provider's class."""
        return type(self).__name__

    @abc.abstractmethod
    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        """Stream one reply; implement as an ``async def`` generator."""
