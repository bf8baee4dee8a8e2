"""Run one tool batch, sequentially or concurrently, yielding tool started/finished events.

Guarantees: a tool runs only if no before-hook interrupted or skipped it; a running tool is never
killed (cancel is cooperative) and its real result is kept; results land in ``run.results`` by
toolUseId, and interrupts raised in ``run.raised`` in toolUse order.
"""

from __future__ import annotations

import asyncio
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
    TOOL_CANCELLED_TEXT,
    error_result,
    error_text,
    result_status,
    tool_result,
    unknown_tool_text,
)
from service.agent.tools import Tool, ToolContext
from service.agent.types import ContentBlock, Interrupt, Message


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
    raised: dict[str, Interrupt] = field(default_factory=dict)
    """Interrupts raised by this run, by toolUseId ("" for the before-tools hook)."""


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
        return error_result(use["toolUseId"], text)
    return None


async def _call(run: BatchRun, use: dict[str, Any], tool: Tool | None) -> ContentBlock | None:
    """Run the tool once; None when it raised an interrupt."""
    tool_use_id = use["toolUseId"]
    name = use.get("name", "")
    started = time.perf_counter()
    exception: Exception | None = None
    if tool is None:
        block = error_result(tool_use_id, unknown_tool_text(name))
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
            return None
        except Exception as exc:  # noqa: BLE001 - a failing tool becomes an error result
            exception = exc
            block = error_result(tool_use_id, error_text(exc))
        else:
            block = tool_result(tool_use_id, value)
    hooks = run.agent.hook_registry
    if hooks.has(AfterToolCallEvent):
        event = AfterToolCallEvent(run.agent, run.session_id, use, tool, block, exception)
        await hooks.fire(event)
        block = event.result
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
    """Run the tools of ``run.uses`` that have no result yet; see the module guarantees."""
    hooks = run.agent.hook_registry
    if hooks.has(BeforeToolsEvent):
        try:
            await hooks.fire(
                BeforeToolsEvent(run.agent, run.session_id, run.message, run.uses, run.book)
            )
        except InterruptSignal as signal:
            run.raised[""] = signal.interrupt
            return
    todo = [use for use in run.uses if use["toolUseId"] not in run.results]
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
    if hooks.has(AfterToolsEvent):
        ordered = [run.results[u["toolUseId"]] for u in run.uses if u["toolUseId"] in run.results]
        await hooks.fire(
            AfterToolsEvent(
                run.agent,
                run.session_id,
                run.message,
                ordered,
                interrupted=bool(run.raised),
                cancelled=run.cancel.is_set,
            )
        )


def raised_in_order(run: BatchRun) -> list[Interrupt]:
    order = [""] + [u["toolUseId"] for u in run.uses]
    return [run.raised[key] for key in order if key in run.raised]
