"""Run one tool batch, sequentially or concurrently, yielding tool started/finished events.

Guarantees: a tool runs only if no before-hook interrupted or skipped it and no cancel was seen
before the batch started; a running tool is never killed (cancel is cooperative) and its real
result is kept; whatever a tool returns or raises (a stray ``CancelledError`` included) ends as a
result the session can store, no larger than ``result_max_bytes`` (else the error result of
``result_too_large_text``), and agent state stays storable; results land in ``run.results``
by toolUseId (a toolUseId the model repeated in one reply: each repeat under a key of its own,
:func:`~service.agent.messages.result_keys`, so every call keeps its result), interrupts raised
in ``run.raised`` in toolUse order. Before-tools and after-tools
hooks fire for every batch a cancel stops, the after-tools event carrying every result the batch
will append, synthetic ones included, in the order it appends them
(:func:`~service.agent.messages.result_order`).

A toolUse whose name no tool can have (:func:`~service.agent.results.tool_name_error`) gets
that error result as soon as the batch starts (past its before-tools hooks and a cancel seen
before it), before any tool runs; it is no tool call: no tool-call hooks (which thus cannot
interrupt or skip it), no started/finished events, span or tool metrics. A valid name that no
tool of the agent has is a tool call like any other, whose result is ``Unknown tool: <name>``.
As in the reference, a toolUse with a valid name whose toolUseId the model also gave one with
an invalid name is dropped (:func:`~service.agent.messages.name_shadowed`): no run, no result.
So is, in a batch resumed from an interrupt, a toolUse without a result whose toolUseId has one
from before the pause (:func:`~service.agent.messages.resume_skipped`): the reference resumes
by toolUseId.

A tool raising ``KeyboardInterrupt`` or ``SystemExit`` ends the batch there (``run.aborted``):
no tool starts after it, and neither its after-tool-call nor the after-tools hooks fire.

Tools with effect ``once``: each is recorded as started in ``run.started`` and a durable
:class:`LedgerChanged` is yielded before it starts (the ``once`` tools that the concurrent
executor starts together share one); one is yielded again once its result is in. A tool found
recorded as started without a result (its owner stopped while it ran) is not run: it raises the
``tool_outcome_unknown`` interrupt, whose answer supplies its result, fails it, or runs it again.
The ledger is kept by toolUseId: a toolUseId the model gave several ``once`` calls is recorded as
started until none of its calls is left without a result, and one answer settles each of them.
One call's hooks, tries (timeout, retries) and span are :mod:`service.agent.tool_call`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any, Literal

from service.agent.batch import BatchRun, LedgerChanged
from service.agent.events import Event, ToolFinished, ToolStarted
from service.agent.hooks import AfterToolsEvent, BeforeToolsEvent
from service.agent.interrupts import InterruptSignal
from service.agent.messages import name_shadowed, result_keys, result_order, resume_skipped
from service.agent.outcomes import (
    OUTCOME_UNKNOWN,
    answered_block,
    idempotency_key,
    outcome_interrupt_id,
    outcome_reason,
)
from service.agent.results import CANCELLED_TEXT, error_result, result_status, tool_name_error
from service.agent.tool_call import SKIP, before_call, call, checked
from service.agent.tools import Tool
from service.agent.types import Interrupt

logger = logging.getLogger(__name__)


_GATE = object()
Settled = Literal["run", "done", "raised"]


def _once(tool: Tool | None) -> bool:
    return tool is not None and tool.policy.effect == "once"


def _record_start(run: BatchRun, tool_use_id: str) -> None:
    run.started[tool_use_id] = {"at": time.time(), "instance": run.instance}


def _settle_started(run: BatchRun, use: dict[str, Any]) -> Settled:
    """What to do with a tool use the ledger says was started: ``"run"`` it (never started, or
    a retry was asked for), ``"done"`` (the answer gave its result), or ``"raised"`` (its
    outcome is unknown: the ``tool_outcome_unknown`` interrupt is raised)."""
    tool_use_id = use["toolUseId"]
    started = run.started.get(tool_use_id)
    if started is None:
        if tool_use_id not in run.settled:
            return "run"
        # Another call of this toolUseId took the answer: it holds for this one too.
        settled = run.settled[tool_use_id]
        if settled is None:
            return "run"
        run.results[run.key(use)] = checked(run, tool_use_id, settled)
        return "done"
    interrupt_id = outcome_interrupt_id(tool_use_id)
    known = run.book.known.get(interrupt_id)
    answer = None
    # An answer holds for the start it was asked about: a retry that was itself cut short is a
    # new start, and is asked about again.
    if (
        known is not None
        and isinstance(known.reason, dict)
        and known.reason.get("started_at") == started.get("at")
    ):
        answer = known.response
    if answer is None:
        key = idempotency_key(run.session_id, tool_use_id)
        logger.warning(
            "session_id=<%s>, tool_use_id=<%s>, tool=<%s>, idempotency_key=<%s>, "
            "started_at=<%s>, instance=<%s> | a once tool was started and has no result: its "
            "outcome is unknown, the caller is asked",
            run.session_id,
            tool_use_id,
            use.get("name", ""),
            key,
            started.get("at"),
            started.get("instance"),
        )
        reason = outcome_reason(use, started, key)
        run.raised[run.key(use)] = Interrupt(id=interrupt_id, name=OUTCOME_UNKNOWN, reason=reason)
        return "raised"
    del run.started[tool_use_id]
    block = run.settled[tool_use_id] = answered_block(tool_use_id, answer)
    if block is None:
        return "run"
    run.results[run.key(use)] = checked(run, tool_use_id, block)
    return "done"


async def _concurrent(
    run: BatchRun, todo: list[dict[str, Any]]
) -> AsyncIterator[Event | LedgerChanged]:
    queue: asyncio.Queue[Any] = asyncio.Queue()
    tool_map = run.agent.tool_map
    todo = [use for use in todo if _settle_started(run, use) == "run"]
    # The once tools wait, past their before-call hooks, for one ledger commit of all of them;
    # by call, not toolUseId, as the model may give one toolUseId to several calls.
    unsettled = {run.key(u) for u in todo if _once(tool_map.get(u.get("name", "")))}
    ready: list[str] = []
    gate = asyncio.Event()
    # The once calls of each toolUseId let through to the gate and without a result yet: the
    # ledger entry of a toolUseId goes only once none is left, so a repeat that finished first
    # does not leave one still running unrecorded (run again after a crash).
    live: Counter[str] = Counter()

    def settle(use: dict[str, Any], *, starts: bool) -> None:
        key = run.key(use)
        if key not in unsettled:
            return
        unsettled.discard(key)
        if starts:
            live[use["toolUseId"]] += 1
            if use["toolUseId"] not in ready:
                ready.append(use["toolUseId"])
        if not unsettled:
            queue.put_nowait(_GATE)

    def ended(tool_use_id: str) -> None:
        live[tool_use_id] -= 1
        if live[tool_use_id] <= 0:
            del live[tool_use_id]
            run.started.pop(tool_use_id, None)

    async def one(use: dict[str, Any]) -> None:
        tool_use_id = use["toolUseId"]
        try:
            name = use.get("name", "")
            tool = tool_map.get(name)
            skipped = await before_call(run, use, tool)
            if skipped is SKIP:
                return
            if skipped is not None:
                run.results[run.key(use)] = skipped
                return
            once = _once(tool)
            if once:
                settle(use, starts=True)
                await gate.wait()
                if run.cancel.immediate or run.aborted is not None:
                    ended(tool_use_id)
                    return
            queue.put_nowait(ToolStarted(tool_use_id, name))
            block = await call(run, use, tool)
            if block is None:
                if once:
                    ended(tool_use_id)
                queue.put_nowait(ToolFinished(tool_use_id, name, _unfinished(run)))
                return
            run.results[run.key(use)] = block
            queue.put_nowait(ToolFinished(tool_use_id, name, result_status(block)))
            if once:
                ended(tool_use_id)
                queue.put_nowait(LedgerChanged(durable=False))
        finally:
            settle(use, starts=False)
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
            elif event is _GATE:
                if ready and not run.cancel.immediate and run.aborted is None:
                    for tool_use_id in ready:
                        _record_start(run, tool_use_id)
                    yield LedgerChanged(durable=True)
                gate.set()
            else:
                yield event
        for task in tasks:
            task.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _unfinished(run: BatchRun) -> Literal["error", "interrupted"]:
    """The finished status of a tool call without a result: it aborted the batch, or raised an
    interrupt."""
    return "error" if run.aborted is not None else "interrupted"


def _check_names(run: BatchRun, uses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give each toolUse without a result whose name is invalid its error result; return the
    others without a result, the ones left to run, but for those it shadows
    (:func:`~service.agent.messages.name_shadowed`) and those a resume skips
    (:func:`~service.agent.messages.resume_skipped`), which get no result."""
    todo = []
    invalid_ids = {use["toolUseId"] for use in run.uses if tool_name_error(use) is not None}
    for use in uses:
        key = run.key(use)
        if key in run.results or resume_skipped(use, key, run.results, run.answered):
            continue
        text = tool_name_error(use)
        if text is None:
            if not name_shadowed(use, invalid_ids):
                todo.append(use)
        else:
            # The name is the model's, of any length: measured like any result.
            tool_use_id = use["toolUseId"]
            run.results[key] = checked(run, tool_use_id, error_result(tool_use_id, text))
    return todo


async def run_batch(run: BatchRun) -> AsyncIterator[Event | LedgerChanged]:
    """Run the tools of ``run.uses`` that have no result yet; see the module guarantees.

    Any cancel seen once the before-tools hooks ran keeps the batch from starting: an immediate
    one, or a deferred one that came while no batch ran (during the model call), which thus
    stops at this boundary instead of after a batch it never meant to let start.
    """
    hooks = run.agent.hook_registry
    if hooks.has(BeforeToolsEvent):
        try:
            await hooks.fire(
                BeforeToolsEvent(
                    run.agent,
                    run.session_id,
                    run.message,
                    run.uses,
                    run.book,
                    invocation_state=run.invocation_state,
                )
            )
        except InterruptSignal as signal:
            run.raised[""] = signal.interrupt
    # No tool starts once the batch is interrupted or a cancel was seen.
    stop_before = bool(run.raised) or run.cancel.is_set
    todo = [] if stop_before else _check_names(run, run.uses)
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
            settled = _settle_started(run, use) if run.started or run.settled else "run"
            if settled == "raised":
                break
            if settled == "done":
                continue
            name = use.get("name", "")
            tool = tool_map.get(name)
            skipped = await before_call(run, use, tool)
            if skipped is SKIP:
                break
            if skipped is not None:
                run.results[run.key(use)] = skipped
                continue
            once = _once(tool)
            if once:
                _record_start(run, tool_use_id)
                yield LedgerChanged(durable=True)
                if run.cancel.immediate:
                    run.started.pop(tool_use_id, None)
                    break
            yield ToolStarted(tool_use_id, name)
            block = await call(run, use, tool)
            if block is None:
                run.started.pop(tool_use_id, None)
                yield ToolFinished(tool_use_id, name, _unfinished(run))
                break
            run.results[run.key(use)] = block
            yield ToolFinished(tool_use_id, name, result_status(block))
            if once:
                run.started.pop(tool_use_id, None)
                yield LedgerChanged(durable=False)
    if run.aborted is not None:
        # As in the reference, whose invocation raised: the batch never completed.
        return
    run.stopped = run.cancel.is_set
    if run.stopped:
        # Cancel beats interrupt and checkpoint: every toolUse gets its result now, so the
        # after-tools event carries exactly the results message the loop appends.
        for use, key in result_order(run.uses, run.results, run.answered):
            if key not in run.results:
                run.results[key] = error_result(use["toolUseId"], CANCELLED_TEXT)
    elif "" in run.raised:
        # As in the reference: a batch its before-tools hook interrupted never started.
        return
    if hooks.has(AfterToolsEvent):
        ordered = [
            run.results[key]
            for _, key in result_order(run.uses, run.results, run.answered)
            if key in run.results
        ]
        await hooks.fire(
            AfterToolsEvent(
                run.agent,
                run.session_id,
                run.message,
                ordered,
                interrupted=bool(run.raised),
                cancelled=run.stopped,
                invocation_state=run.invocation_state,
            )
        )


def raised_in_order(run: BatchRun) -> list[Interrupt]:
    """The interrupts the batch raised: the before-tools hook's, then its tool calls', in
    toolUse order (a toolUseId the model repeated: once for each call that raised)."""
    order = ["", *result_keys(run.uses)]
    return [run.raised[key] for key in order if key in run.raised]
