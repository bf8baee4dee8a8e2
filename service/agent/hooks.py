"""Hook events of the loop and the registry that fires them.

Callbacks of one event type run in registration order (``After*`` events in reverse, so hooks
nest like context managers); sync and async callbacks are both accepted. An input rejected by
validation fires no hook at all.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from service.agent.interrupts import InterruptBook, before_tool_call_id, before_tools_id
from service.agent.types import AgentResult, ContentBlock, Message

if TYPE_CHECKING:
    from service.agent.definition import AgentDefinition
    from service.agent.provider import ModelReply, ModelRequest
    from service.agent.tools import Tool


@dataclass(slots=True)
class HookEvent:
    agent: AgentDefinition
    session_id: str


@dataclass(slots=True)
class BeforeInvocationEvent(HookEvent):
    """Fires after validation, before the input changes anything (also on every resume).

    Only the ``Tool was interrupted.`` results of a batch a new prompt abandons come first, as
    in the reference, where they are part of turning the prompt into messages.
    """

    input: Any
    invocation_state: dict[str, Any]
    agent_state: dict[str, Any]


@dataclass(slots=True)
class AfterInvocationEvent(HookEvent):
    result: AgentResult
    invocation_state: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class MessageAddedEvent(HookEvent):
    """A message was added to the history: ``message`` as added, though history joins it to
    the last message when both have the same role."""

    message: Message


@dataclass(slots=True)
class BeforeModelCallEvent(HookEvent):
    request: ModelRequest
    invocation_state: dict[str, Any] = field(default_factory=dict)

    @property
    def projected_input_tokens(self) -> int | None:
        """Strands' estimate of the call's input tokens: Cairn makes none (None, which Strands
        gives when its estimate failed)."""
        return None


@dataclass(slots=True)
class AfterModelCallEvent(HookEvent):
    """``reply`` (Strands' ``stop_response``: ``message`` and ``stop_reason``) or the ``error``
    (Strands' ``exception``) of the model call; neither when a cancel cut it short."""

    reply: ModelReply | None
    error: Exception | None = None
    cancelled: bool = False
    invocation_state: dict[str, Any] = field(default_factory=dict)

    @property
    def stop_response(self) -> ModelReply | None:
        """Strands' name of ``reply``."""
        return self.reply

    @property
    def exception(self) -> Exception | None:
        """Strands' name of ``error``."""
        return self.error


@dataclass(slots=True)
class BeforeToolsEvent(HookEvent):
    """Fires before a batch runs (also when answers re-run it); may raise an interrupt."""

    message: Message
    tool_uses: list[dict[str, Any]]
    _book: InterruptBook = field(default_factory=InterruptBook, repr=False)
    invocation_state: dict[str, Any] = field(default_factory=dict)

    def interrupt(self, name: str, reason: Any = None, response: Any = None) -> Any:
        return self._book.ask(before_tools_id(name), name, reason, response)


@dataclass(slots=True)
class AfterToolsEvent(HookEvent):
    """Fires after a batch; ``results`` are those the results message gets, in its order.

    ``message`` is the assistant's message of the batch's tool calls (Strands' is the user
    message of the results, whose content ``results`` is).
    """

    message: Message
    results: list[ContentBlock]
    interrupted: bool = False
    cancelled: bool = False
    invocation_state: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class BeforeToolCallEvent(HookEvent):
    """Fires before one tool runs; set ``cancel_tool`` to skip it.

    A string is the skipped tool's error text; ``True`` gives the reference's default text.
    Never fires for a toolUse whose name is invalid: that one gets its error result unasked.
    """

    tool_use: dict[str, Any]
    tool: Tool | None
    invocation_state: dict[str, Any]
    cancel_tool: bool | str | None = None
    _book: InterruptBook = field(default_factory=InterruptBook, repr=False)

    def interrupt(self, name: str, reason: Any = None, response: Any = None) -> Any:
        tool_use_id = str(self.tool_use.get("toolUseId", ""))
        return self._book.ask(before_tool_call_id(tool_use_id, name), name, reason, response)

    @property
    def selected_tool(self) -> Tool | None:
        """Strands' name of ``tool``."""
        return self.tool


@dataclass(slots=True)
class AfterToolCallEvent(HookEvent):
    """Fires after one tool ran, or was skipped by a before-tool-call hook's ``cancel_tool``
    (never for a toolUse whose name is invalid); ``result`` may be replaced by the callback.

    ``exception`` is what the tool raised, a stray ``asyncio.CancelledError`` included, or what
    the reference reports for a result that is not the tool's: for an input the tool's
    validation refuses, the ``ValueError`` whose text the result gives; for a toolUse without an
    input, ``KeyError('input')``; for a tool the agent does not have, an ``Exception`` with the
    ``Unknown tool: <name>`` text. ``cancel_message`` is the skip's text when a before-tool-call
    hook skipped it. ``tool`` is None for a tool the agent does not have and for a skipped call,
    as the reference's ``selected_tool``. ``result`` is the content block ``{"toolResult": ...}``
    (Strands' is the bare ToolResult).

    A callback that raises (after the tool ran) makes the result ``Error: <its text>``, and the
    callbacks fire again with that result and what it raised as ``exception``; raising again
    (or raising after a skip) fails the invocation, as in the reference.
    """

    tool_use: dict[str, Any]
    tool: Tool | None
    result: ContentBlock
    exception: BaseException | None = None
    cancel_message: str | None = None
    invocation_state: dict[str, Any] = field(default_factory=dict)
    duration: float | None = None
    """Seconds since the tool started, as Strands measures it (None for a skipped tool)."""

    @property
    def selected_tool(self) -> Tool | None:
        """Strands' name of ``tool``."""
        return self.tool


E = TypeVar("E", bound=HookEvent)
HookCallback = Callable[[E], "Awaitable[None] | None"]


class HookRegistry:
    """Callbacks by event type; cheap to ask whether anything listens."""

    __slots__ = ("_callbacks",)

    def __init__(self) -> None:
        self._callbacks: dict[type[HookEvent], list[Callable[[Any], Any]]] = {}

    def add_callback(self, event_type: type[E], callback: HookCallback[E]) -> None:
        callbacks = self._callbacks.setdefault(event_type, [])
        if event_type.__name__.startswith("After"):
            callbacks.insert(0, callback)
        else:
            callbacks.append(callback)

    def has(self, event_type: type[HookEvent]) -> bool:
        return event_type in self._callbacks

    async def fire(self, event: HookEvent) -> None:
        for callback in self._callbacks.get(type(event), ()):
            outcome = callback(event)
            if inspect.isawaitable(outcome):
                await outcome


class HookProvider(abc.ABC):
    """A bundle of callbacks an agent definition carries."""

    @abc.abstractmethod
    def register_hooks(self, registry: HookRegistry) -> None: ...


def build_registry(providers: Sequence[HookProvider]) -> HookRegistry:
    registry = HookRegistry()
    for provider in providers:
        provider.register_hooks(registry)
    return registry
