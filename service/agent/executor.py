"""Run one tool batch, sequentially or concurrently, yielding tool started/finished events.

Guarantees: a tool runs only if no before-hook interrupted or skipped it and no cancel was seen
before the batch started; a running tool is never killed (cancel is cooperative) and its real
result is kept; whatever a tool returns or raises (a stray ``CancelledError`` included) ends as a
result the session can store, no larger than ``result_max_bytes`` (else the error result of
``result_too_large_text``), and agent state stays storable; results land in ``run.results``
by toolUseId, interrupts raised in ``run.raised`` in toolUse order. Before-tools and after-tools
hooks fire for every batch a cancel stops, the after-tools event carrying every result the batch
will append, synthetic ones included.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from service.agent.cancel import CancelSignal
from service.agent.definition import AgentDefinition
from service.agent.events import Event, ToolFinished, ToolStarted
from service.agent.hooks import (
    AfterToolCallEvent,
    AfterToolsEvent,
    BeforeToolCallEvent,
    BeforeToolsEvent,
)
from service.agent.interrupts import InterruptBook, InterruptSignal
from service.agent.metrics import InvocationMetrics
from service.agent.results import (
    CANCELLED_TEXT,
    TOOL_CANCELLED_TEXT,
    error_result,
    error_text,
    result_status,
    tool_result,
    unknown_tool_text,
)
from service.agent.storable import StateGuard, checked_result, state_refused
from service.agent.tools import Tool, ToolContext
from service.agent.types import ContentBlock, Interrupt, Message

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class BatchRun:
    agent: AgentDefinition
    session_id: str
    message: Message
    uses: list[dict[str, Any]]
    results: dict[str, ContentBlock]
    book: InterruptBook
    cancel: CancelSignal
    invocation_state: dict[str, Any]
    agent_state: dict[str, Any]
    metrics: InvocationMetrics
    state_guard: StateGuard
    result_max_bytes: int | None = None
    """The invocation's ``result_max_bytes``: the largest tool result kept (None: no limit)."""
    raised: dict[str, Interrupt] = field(default_factory=dict)
    """Interrupts raised by this run, by toolUseId ("" for the before-tools hook)."""
    stopped: bool = False
    """A cancel stopped this batch (decided when its after-tools event is built): every
    toolUse then has a result in ``results``, and no interrupt of it stays pending."""


_SKIP = object()


async def _before_call(run: BatchRun, use: dict[str, Any], tool: Tool | None) -> Any:
    """Fire before-tool-call hooks: None to go on, a result block to skip, _SKIP if interrupted."""
    hooks = run.agent.hook_registry
    if not hooks.has(BeforeToolCallEvent):
        return None
    event = BeforeToolCallEvent(
        run.agent, run.session_id, use, tool, run.invocation_state, None, run.book
    )
    try:
        await hooks.fire(event)
    except InterruptSignal as signal:
        run.raised[use["toolUseId"]] = signal.interrupt
        return _SKIP
    if event.cancel_tool:
        text = event.cancel_tool if isinstance(event.cancel_tool, str) else TOOL_CANCELLED_TEXT
        return _checked(run, use["toolUseId"], error_result(use["toolUseId"], text))
    return None


def _checked(run: BatchRun, tool_use_id: str, block: Any) -> ContentBlock:
    """``block`` storable and within the invocation's maximum result size, or its error result."""
    return checked_result(tool_use_id, block, run.result_max_bytes, session_id=run.session_id)


def _cancelling() -> bool:
    """True when the running task itself is being cancelled (not a tool's own CancelledError)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _check_state(run: BatchRun, use: dict[str, Any]) -> str | None:
    """Revert the unstorable agent-state writes of the tool that just ran; say why, if any."""
    reason = run.state_guard.check()
    if reason is not None:
        logger.warning(
            "session_id=<%s>, tool_use_id=<%s>, reason=<%s> | agent state write reverted",
            run.session_id,
            use["toolUseId"],
            reason,
        )
    return reason


async def _call(run: BatchRun, use: dict[str, Any], tool: Tool | None) -> ContentBlock | None:
    """Run the tool once; None when it raised an interrupt."""
    tool_use_id = use["toolUseId"]
    name = use.get("name", "")
    started = time.perf_counter()
    exception: BaseException | None = None
    if tool is None:
        # The name is the model's: measured too, so no result escapes the maximum size.
        block = _checked(run, tool_use_id, error_result(tool_use_id, unknown_tool_text(name)))
    else:
        context = ToolContext(
            run.session_id,
            tool_use_id,
            run.cancel,
            run.invocation_state,
            run.agent_state,
            use,
            run.agent.name,
            run.book,
        )
        try:
            value = await tool.invoke(use.get("input") or {}, context)
        except InterruptSignal as signal:
            run.raised[tool_use_id] = signal.interrupt
            _check_state(run, use)
            return None
        except asyncio.CancelledError as exc:
            # Libraries leak CancelledError from their inner timeouts; only a cancellation of
            # this task is one of the invocation, anything else is the tool failing.
            if _cancelling():
                raise
            exception = exc
            block = error_result(tool_use_id, error_text(exc))
        except Exception as exc:  # noqa: BLE001 - a failing tool becomes an error result
            exception = exc
            block = error_result(tool_use_id, error_text(exc))
        else:
            block = tool_result(tool_use_id, value)
        block = _checked(run, tool_use_id, block)
        refused = _check_state(run, use)
        if refused is not None:
            # Rare: the explanation grows the result, so it is measured again.
            block = _checked(run, tool_use_id, state_refused(block, refused))
    hooks = run.agent.hook_registry
    if hooks.has(AfterToolCallEvent):
        event = AfterToolCallEvent(run.agent, run.session_id, use, tool, block, exception)
        await hooks.fire(event)
        # A hook may replace or edit the result: the session must be able to store that too.
        block = _checked(run, tool_use_id, event.result)
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    run.metrics.tool(name, elapsed_ms, error=result_status(block) == "error")
    return block


async def _concurrent(run: BatchRun, todo: list[dict[str, Any]]) -> AsyncIterator[Event]:
    queue: asyncio.Queue[Event | None] = asyncio.Queue()
    tool_map = run.agent.tool_map

    async def one(use: dict[str, Any]) -> None:
        try:
            tool_use_id = use["toolUseId"]
            name = use.get("name", "")
            tool = tool_map.get(name)
            skipped = await _before_call(run, use, tool)
            if skipped is _SKIP:
                return
            if skipped is not None:
                run.results[tool_use_id] = skipped
                return
            queue.put_nowait(ToolStarted(tool_use_id, name))
            block = await _call(run, use, tool)
            if block is None:
                queue.put_nowait(ToolFinished(tool_use_id, name, "interrupted"))
                return
            run.results[tool_use_id] = block
            queue.put_nowait(ToolFinished(tool_use_id, name, result_status(block)))
        finally:
            queue.put_nowait(None)

    # Plain tasks rather than a TaskGroup: this generator may be closed at a ``yield``, where a
    # TaskGroup would wrap GeneratorExit; the finally below owns and reaps every task instead.
    tasks = [asyncio.create_task(one(use)) for use in todo]
    try:
        remaining = len(tasks)
        while remaining:
            event = await queue.get()
            if event is None:
                remaining -= 1
            else:
                yield event
        for task in tasks:
            task.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def run_batch(run: BatchRun) -> AsyncIterator[Event]:
    """Run the tools of ``run.uses`` that have no result yet; see the module guarantees.

    Any cancel seen once the before-tools hooks ran keeps the batch from starting: an immediate
    one, or a deferred one that came while no batch ran (during the model call), which thus
    stops at this boundary instead of after a batch it never meant to let start.
    """
    hooks = run.agent.hook_registry
    if hooks.has(BeforeToolsEvent):
        try:
            await hooks.fire(
                BeforeToolsEvent(run.agent, run.session_id, run.message, run.uses, run.book)
            )
        except InterruptSignal as signal:
            run.raised[""] = signal.interrupt
    # No tool starts once the batch is interrupted or a cancel was seen.
    stop_before = bool(run.raised) or run.cancel.is_set
    todo = [] if stop_before else [u for u in run.uses if u["toolUseId"] not in run.results]
    if run.agent.executor == "concurrent" and len(todo) > 1:
        async for event in _concurrent(run, todo):
            yield event
    else:
        # Sequential, inline rather than a nested generator: this is the hot path.
        tool_map = run.agent.tool_map
        for use in todo:
            if run.cancel.immediate:
                break
            tool_use_id = use["toolUseId"]
            name = use.get("name", "")
            tool = tool_map.get(name)
            skipped = await _before_call(run, use, tool)
            if skipped is _SKIP:
                break
            if skipped is not None:
                run.results[tool_use_id] = skipped
                continue
            yield ToolStarted(tool_use_id, name)
            block = await _call(run, use, tool)
            if block is None:
                yield ToolFinished(tool_use_id, name, "interrupted")
                break
            run.results[tool_use_id] = block
            yield ToolFinished(tool_use_id, name, result_status(block))
    run.stopped = run.cancel.is_set
    if run.stopped:
        # Cancel beats interrupt and checkpoint: every toolUse gets its result now, so the
        # after-tools event carries exactly the results message the loop appends.
        for use in run.uses:
            tool_use_id = use["toolUseId"]
            if tool_use_id not in run.results:
                run.results[tool_use_id] = error_result(tool_use_id, CANCELLED_TEXT)
    elif "" in run.raised:
        # As in the reference: a batch its before-tools hook interrupted never started.
        return
    if hooks.has(AfterToolsEvent):
        ordered = [run.results[u["toolUseId"]] for u in run.uses if u["toolUseId"] in run.results]
        await hooks.fire(
            AfterToolsEvent(
                run.agent,
                run.session_id,
                run.message,
                ordered,
                interrupted=bool(run.raised),
                cancelled=run.stopped,
            )
        )


def raised_in_order(run: BatchRun) -> list[Interrupt]:
    order = [""] + [u["toolUseId"] for u in run.uses]
    return [run.raised[key] for key in order if key in run.raised]
