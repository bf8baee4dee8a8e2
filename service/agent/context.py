"""What the model sees of a long conversation: the agent's context policy and the session's view.

Guarantees: the session's history is never edited here; the model's view is a pure function of
the history and the session's :class:`ContextState` (which is persisted with the session, so a
resume anywhere sends the same view). A view always starts with a user message, never holds a
toolResult without its toolUse nor a toolUse without its results, never has two consecutive
messages of one role, and under ``sliding_window`` or ``summarize`` holds at most
``max_messages`` messages whenever the history allows it. A state only moves forward: the
first message in view never moves back. How the window differs from the reference's
``SlidingWindowConversationManager``: docs/from-strands.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from service.agent.errors import ModelError
from service.agent.messages import for_model
from service.agent.provider import ModelProvider, ModelReply, ModelRequest
from service.agent.types import ContentBlock, Message, Usage

if TYPE_CHECKING:
    from service.agent.definition import AgentDefinition

Strategy = Literal["sliding_window", "summarize", "none"]
STRATEGIES: tuple[Strategy, ...] = ("sliding_window", "summarize", "none")

DEFAULT_MAX_MESSAGES = 40
"""The reference SDK's default window."""
DEFAULT_KEEP_RECENT = 10
MIN_MAX_MESSAGES = 3
"""The smallest window that always fits a tool cycle: the request, the toolUse, its results."""

OMITTED_TEXT = "[Earlier messages of this conversation are not shown.]"
"""Opens a view that would start on an assistant message when no earlier request is known."""

SUMMARY_REQUEST = "Summarize the conversation above."
SUMMARY_PROMPT = (
    "You summarize conversations so that they can continue without their earlier messages. "
    "Write a concise, structured summary in the third person: the requests made, the tools "
    "called and what they returned, the facts and decisions reached, and what remains open. "
    "Do not address the user and do not call tools."
)


@dataclass(frozen=True, slots=True)
class ContextPolicy:
    """How much of the conversation the model sees.

    ``sliding_window``: the most recent ``max_messages`` messages (the default, as in the
    reference SDK). ``summarize``: once the view outgrows ``max_messages``, the oldest messages
    are replaced by a summary, keeping at least the ``keep_recent`` most recent ones; the
    summary is written by ``summarizer`` (another agent: its model and system prompt) or by the
    agent's own model. ``none``: the whole history. On a context-overflow failure the first two
    reduce the view further and retry; ``none`` does not.
    """

    strategy: Strategy = "sliding_window"
    max_messages: int = DEFAULT_MAX_MESSAGES
    keep_recent: int = DEFAULT_KEEP_RECENT
    summarizer: AgentDefinition | None = None

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"context strategy must be one of {', '.join(STRATEGIES)}, not {self.strategy!r}"
            )
        for name in ("max_messages", "keep_recent"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"context {name} must be an integer, not {value!r}")  # noqa: TRY004
        if self.max_messages < MIN_MAX_MESSAGES:
            raise ValueError(
                f"context max_messages must be at least {MIN_MAX_MESSAGES}, not {self.max_messages}"
            )
        if self.strategy == "summarize" and not 1 <= self.keep_recent <= self.max_messages - 2:
            raise ValueError(
                "context keep_recent must be between 1 and max_messages - 2 "
                f"({self.max_messages - 2}), not {self.keep_recent}"
            )
        if self.summarizer is not None and self.strategy != "summarize":
            raise ValueError("a context summarizer needs strategy 'summarize'")

    def describe(self) -> dict[str, Any]:
        """The policy as plain data (for listings)."""
        out: dict[str, Any] = {"strategy": self.strategy}
        if self.strategy != "none":
            out["max_messages"] = self.max_messages
        if self.strategy == "summarize":
            out["keep_recent"] = self.keep_recent
            out["summarizer"] = self.summarizer.name if self.summarizer is not None else None
        return out


@dataclass(slots=True)
class ContextState:
    """Where the model's view of a session starts: history before ``start`` is out of view,
    replaced by ``summary`` (content blocks of a user message) when one was written."""

    start: int = 0
    summary: list[ContentBlock] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "summary": self.summary}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ContextState:
        start = data.get("start", 0)
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError(f"context start must be a non-negative integer, not {start!r}")
        summary = data.get("summary")
        if summary is not None and not isinstance(summary, list):
            raise ValueError("context summary must be a list of content blocks")
        return cls(start=start, summary=list(summary) if summary is not None else None)


def _has(message: Message, kind: str) -> bool:
    return any(kind in block for block in message.get("content", ()))


def can_start(messages: Sequence[Message], i: int) -> bool:
    """Whether a view may begin with history message ``i`` (after its opening user text).

    A user message may, unless it holds toolResults (their toolUse would be out of view); an
    assistant message may when the results of all its toolUses follow it.
    """
    if not 0 <= i < len(messages):
        return False
    message = messages[i]
    if message.get("role") == "user":
        return not _has(message, "toolResult")
    ids = {b["toolUse"]["toolUseId"] for b in message.get("content", ()) if "toolUse" in b}
    if not ids:
        return True
    if i + 1 >= len(messages):
        return False
    answered = {
        b["toolResult"].get("toolUseId")
        for b in messages[i + 1].get("content", ())
        if "toolResult" in b
    }
    return ids <= answered


def view_size(messages: Sequence[Message], start: int, summary: bool) -> int:
    """Messages in the view that starts at ``start``: the opening user text adds one message
    when the view would otherwise start on an assistant message."""
    if (start == 0 and not summary) or start >= len(messages):
        return len(messages)  # the whole history, as build_view sends it
    opens_on_assistant = messages[start].get("role") == "assistant"
    return len(messages) - start + (1 if opens_on_assistant else 0)


def build_view(messages: Sequence[Message], state: ContextState | None) -> list[Message]:
    """The messages the model is sent for ``messages`` seen from ``state``."""
    if state is None or (state.start == 0 and state.summary is None):
        return list(messages)
    start = state.start
    rest = list(messages[start:])
    if not rest:
        return list(messages)
    opening = state.summary if state.summary is not None else None
    if opening is None:
        if rest[0].get("role") == "user":
            return rest
        opening = _last_request(messages, start)
    first = rest[0]
    if first.get("role") == "user":
        return [{"role": "user", "content": [*opening, *first.get("content", ())]}, *rest[1:]]
    return [{"role": "user", "content": list(opening)}, *rest]


def _last_request(messages: Sequence[Message], before: int) -> list[ContentBlock]:
    """The user's last request before ``before`` (its blocks other than toolResults), so a view
    opening inside a long run of tool cycles keeps what the model is working on."""
    for i in range(before - 1, -1, -1):
        message = messages[i]
        if message.get("role") != "user":
            continue
        blocks = [b for b in message.get("content", ()) if "toolResult" not in b]
        if blocks:
            return blocks
    return [{"text": OMITTED_TEXT}]


def window_start(
    messages: Sequence[Message], state: ContextState, budget: int, summary: bool
) -> int | None:
    """The earliest start at or after ``state.start`` whose view fits ``budget`` messages."""
    for i in range(max(state.start, len(messages) - budget), len(messages)):
        if can_start(messages, i) and view_size(messages, i, summary) <= budget:
            return i
    return None


def smaller_start(messages: Sequence[Message], state: ContextState) -> int | None:
    """A start after ``state.start`` whose view is about half the current one (the largest
    view that is not more than half, else the smallest possible); None when none is smaller."""
    summary = state.summary is not None
    current = view_size(messages, state.start, summary) if messages else 0
    candidates = [
        i
        for i in range(state.start + 1, len(messages))
        if can_start(messages, i) and view_size(messages, i, summary) < current
    ]
    if not candidates:
        return None
    for i in candidates:
        if view_size(messages, i, summary) <= max(1, current // 2):
            return i
    return candidates[-1]


def summary_start(messages: Sequence[Message], state: ContextState, keep: int) -> int | None:
    """Where a new summary should end: the latest start that keeps at least ``keep`` messages
    in view after ``state.start``, else the earliest start after it."""
    for i in range(len(messages) - keep, state.start, -1):
        if can_start(messages, i):
            return i
    for i in range(max(state.start + 1, len(messages) - keep + 1), len(messages)):
        if can_start(messages, i):
            return i
    return None


def summary_request(messages: Sequence[Message], state: ContextState, end: int) -> list[Message]:
    """What the summarizer is sent: the view of ``messages[:end]`` (the earlier summary first)
    and the request for a summary."""
    source = build_view(messages[:end], state)
    ask: ContentBlock = {"text": SUMMARY_REQUEST}
    if source and source[-1].get("role") == "user":
        last = source[-1]
        return [*source[:-1], {"role": "user", "content": [*last.get("content", ()), ask]}]
    return [*source, {"role": "user", "content": [ask]}]


def summary_blocks(reply: Message) -> list[ContentBlock]:
    """The text of a summarizer's reply, as the content of the summary message; cited text
    (a Bedrock reply's ``citationsContent``) counts as text, its citations left out."""
    blocks: list[ContentBlock] = []
    for block in reply.get("content", ()):
        cited = block.get("citationsContent")
        parts = cited.get("content", ()) if isinstance(cited, dict) else (block,)
        blocks.extend({"text": part["text"]} for part in parts if part.get("text"))
    return blocks


async def write_summary(
    summarizer: ModelProvider,
    system_prompt: str | None,
    request_messages: list[Message],
    base: ModelRequest,
) -> tuple[list[ContentBlock], Usage]:
    """One summarizer call: the summary's blocks and what the call cost.

    Raises :class:`ModelError` when the summarizer fails or writes no text; a cancel ends the
    call early with the same error (the caller observes the cancel itself).
    """
    request = ModelRequest(
        messages=for_model(request_messages),
        system_prompt=system_prompt if system_prompt is not None else SUMMARY_PROMPT,
        tool_specs=base.tool_specs,
        cancel=base.cancel,
        deadline=base.deadline,
        session_id=base.session_id,
    )
    reply: ModelReply | None = None
    stream = summarizer.stream(request)
    try:
        async for chunk in stream:
            if isinstance(chunk, ModelReply):
                reply = chunk
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
    if reply is None or reply.stop_reason == "cancelled":
        raise ModelError("summarizer: the call ended without a reply")
    blocks = summary_blocks(reply.message)
    if not blocks:
        raise ModelError("summarizer: the reply holds no text")
    return blocks, reply.usage
