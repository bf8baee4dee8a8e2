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

A tool raising ``KeyboardInterrupt`` or ``SystemExit`` ends the batch there (``run.aborted``):
no tool starts after it, and neither its after-tool-call nor the after-tools hooks fire.

Tools with effect ``once``: each is recorded as started in ``run.started`` and a durable
:class:`LedgerChanged` is yielded before it starts (the ``once`` tools that the concurrent
executor starts together share one); one is yielded again once its result is in. A tool found
recorded as started without a result (its owner stopped while it ran) is not run: it raises the
``tool_outcome_unknown`` interrupt, whose answer supplies its result, fails it, or runs it again.
A tool with ``timeout_s`` sees its cancel signal when it runs longer, then is abandoned with an
error result; an idempotent tool with ``retries`` runs again after it raised or timed out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from service.agent import tracing
from service.agent.aborts import ToolAborted, aborted_text, guarded
from service.agent.batch import BatchRun, LedgerChanged
from service.agent.cancel import CancelSignal
from service.agent.events import Event, ToolFinished, ToolStarted
from service.agent.hooks import (
    AfterToolCallEvent,
    AfterToolsEvent,
    BeforeToolCallEvent,
    BeforeToolsEvent,
)
from service.agent.interrupts import InterruptSignal
from service.agent.messages import name_shadowed, result_keys, result_order
from service.agent.outcomes import (
    OUTCOME_UNKNOWN,
    answered_block,
    outcome_interrupt_id,
    outcome_reason,
)
from service.agent.results import (
    CANCELLED_TEXT,
    TOOL_CANCELLED_TEXT,
    ToolFailure,
    error_result,
    escaped_failure,
    failure,
    result_status,
    timeout_text,
    tool_name_error,
    tool_result,
    unknown_tool_text,
)
from service.agent.storable import checked_result, state_refused
from service.agent.tools import Tool, ToolContext, ToolPolicy
from service.agent.types import ContentBlock, Interrupt

logger = logging.getLogger(__name__)


class ToolTimeoutError(Exception):
    """The tool ran longer than its ``timeout_s``."""


_SKIP = object()
_GATE = object()
TIMEOUT_GRACE_S = 1.0
"""How long a tool past its timeout may take to return once its cancel signal is set (at most
the timeout itself) before it is abandoned."""
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
        return "run"
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
        key = f"{run.session_id}:{tool_use_id}"
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
    block = answered_block(tool_use_id, answer)
    if block is None:
        return "run"
    run.results[run.key(use)] = _checked(run, tool_use_id, block)
    return "done"


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
        run.raised[run.key(use)] = signal.interrupt
        return _SKIP
    if event.cancel_tool:
        text = event.cancel_tool if isinstance(event.cancel_tool, str) else TOOL_CANCELLED_TEXT
        block = _checked(run, use["toolUseId"], error_result(use["toolUseId"], text))
        if hooks.has(AfterToolCallEvent):
            # As for a tool that ran: the after-tool-call hooks see (and may replace) the result.
            after = AfterToolCallEvent(
                run.agent,
                run.session_id,
                use,
                tool,
                block,
                cancel_message=text,
                invocation_state=run.invocation_state,
            )
            await hooks.fire(after)
            block = _checked(run, use["toolUseId"], after.result)
        return block
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


async def _forward_cancel(source: CancelSignal, target: CancelSignal) -> None:
    await source.wait()
    target.cancel(source.custom_message)


def _consume(task: asyncio.Future[Any]) -> None:
    """Retrieve what an abandoned tool task ended with, so nothing is reported as unheard."""
    if not task.cancelled():
        task.exception()


async def _invoke(tool: Tool, use: dict[str, Any], context: ToolContext, run: BatchRun) -> Any:
    """The tool's value; past its timeout its own cancel signal is set, and after a short
    grace it is abandoned (an async tool is cancelled; a sync one's thread cannot be)."""
    timeout_s = tool.policy.timeout_s
    # As the model gave it, null and lists included: refusing what it cannot take is the tool's.
    tool_input = use.get("input", {})
    if timeout_s is None:
        return await guarded(tool.invoke(tool_input, context))
    task = asyncio.ensure_future(guarded(tool.invoke(tool_input, context)))
    forward = asyncio.ensure_future(_forward_cancel(run.cancel, context.cancel))
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if done:
            return task.result()
        context.cancel.cancel(f"timed out after {timeout_s:g} s")
        await asyncio.wait({task}, timeout=min(TIMEOUT_GRACE_S, timeout_s))
        raise ToolTimeoutError(timeout_text(tool.name, timeout_s))
    finally:
        forward.cancel()
        if not task.done():
            task.cancel()
        task.add_done_callback(_consume)


async def _pause_before_retry(run: BatchRun, delay_s: float) -> bool:
    """Wait ``delay_s``; False when a cancel came first or meanwhile (no more tries then)."""
    if run.cancel.is_set:
        return False
    if delay_s > 0:
        waiter = asyncio.ensure_future(run.cancel.wait())
        try:
            await asyncio.wait({waiter}, timeout=delay_s)
        finally:
            waiter.cancel()
    return not run.cancel.is_set


def _may_retry(policy: ToolPolicy, attempt: int) -> bool:
    return policy.effect == "idempotent" and attempt < policy.retries


async def _call(run: BatchRun, use: dict[str, Any], tool: Tool | None) -> ContentBlock | None:
    """Run the tool (again, up to its retries) in a span of its own; None when it raised an
    interrupt or ended the batch (``run.aborted``)."""
    name = use.get("name", "")
    attributes = tracing.tool_call(name, str(use["toolUseId"]), run.session_id, run.agent.name)
    with run.tracer.span(tracing.tool_span_name(name), attributes) as span:
        return await _traced_call(run, use, tool, span)


async def _traced_call(
    run: BatchRun, use: dict[str, Any], tool: Tool | None, span: tracing.Span
) -> ContentBlock | None:
    tool_use_id = use["toolUseId"]
    name = use.get("name", "")
    started = time.perf_counter()
    exception: BaseException | None = None
    if tool is None:
        # The name is the model's: measured too, so no result escapes the maximum size.
        text = unknown_tool_text(name)
        block = _checked(run, tool_use_id, error_result(tool_use_id, text))
        # What the reference's after-tool-call hooks see for it.
        exception = Exception(text)
    else:
        policy = tool.policy
        attempt = 0
        while True:
            context = ToolContext(
                run.session_id,
                tool_use_id,
                run.cancel if policy.timeout_s is None else CancelSignal(),
                run.invocation_state,
                run.agent_state,
                use,
                run.agent.name,
                run.book,
            )
            exception = None
            try:
                value = await _invoke(tool, use, context, run)
            except InterruptSignal as signal:
                run.raised[run.key(use)] = signal.interrupt
                _check_state(run, use)
                span.set(tracing.TOOL_ATTEMPTS, attempt + 1)
                span.set(tracing.TOOL_STATUS, "interrupted")
                return None
            except ToolAborted as exc:
                # As under the reference, it ends the invocation: no result, no hooks.
                run.aborted = aborted_text(name, tool_use_id, exc.exception)
                _check_state(run, use)
                span.set(tracing.TOOL_ATTEMPTS, attempt + 1)
                span.set(tracing.TOOL_STATUS, "error")
                span.failed(run.aborted, exc.exception)
                return None
            except asyncio.CancelledError as exc:
                # Libraries leak CancelledError from their inner timeouts; only a cancellation
                # of this task is one of the invocation, anything else is the tool failing.
                if _cancelling():
                    raise
                text, exception = failure(exc)
                block = error_result(tool_use_id, text)
            except ToolTimeoutError as exc:
                exception = exc
                block = error_result(tool_use_id, str(exc))
            except ToolFailure as exc:
                exception = exc.exception
                block = error_result(tool_use_id, exc.text)
            except Exception as exc:  # noqa: BLE001 - a failing tool becomes an error result
                text, exception = failure(exc)
                block = error_result(tool_use_id, text)
            else:
                block = tool_result(tool_use_id, value)
            if exception is None or not _may_retry(policy, attempt):
                break
            delay_s = policy.backoff_s * 2**attempt
            attempt += 1
            logger.info(
                "session_id=<%s>, tool_use_id=<%s>, tool=<%s>, attempt=<%d>, delay_s=<%g>, "
                "error=<%s> | tool failed, trying again",
                run.session_id,
                tool_use_id,
                name,
                attempt + 1,
                delay_s,
                type(exception).__name__,
            )
            if not await _pause_before_retry(run, delay_s):
                break
        span.set(tracing.TOOL_ATTEMPTS, attempt + 1)
        block = _checked(run, tool_use_id, block)
        refused = _check_state(run, use)
        if refused is not None:
            # Rare: the explanation grows the result, so it is measured again.
            block = _checked(run, tool_use_id, state_refused(block, refused))
    hooks = run.agent.hook_registry
    if hooks.has(AfterToolCallEvent):

        def after(block: ContentBlock, exception: BaseException | None) -> AfterToolCallEvent:
            return AfterToolCallEvent(
                run.agent,
                run.session_id,
                use,
                tool,
                block,
                exception,
                invocation_state=run.invocation_state,
                duration=time.perf_counter() - started,
            )

        event = after(block, exception)
        try:
            await hooks.fire(event)
        except InterruptSignal:
            raise
        except Exception as exc:  # noqa: BLE001 - as the reference: the hook's failure is the result
            # The reference's executor catches it as a tool failure: the result becomes
            # ``Error: <its text>`` and the hooks fire again with it as the exception; a second
            # failure escapes (the invocation fails), so this never loops.
            text, exception = escaped_failure(exc)
            event = after(_checked(run, tool_use_id, error_result(tool_use_id, text)), exception)
            await hooks.fire(event)
        # A hook may replace or edit the result: the session must be able to store that too.
        block = _checked(run, tool_use_id, event.result)
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    status = result_status(block)
    run.metrics.tool(name, elapsed_ms, error=status == "error")
    span.set(tracing.TOOL_STATUS, status)
    if status == "error":
        span.failed(tracing.tool_error(block), exception)
    return block


async def _concurrent(
    run: BatchRun, todo: list[dict[str, Any]]
) -> AsyncIterator[Event | LedgerChanged]:
    queue: asyncio.Queue[Any] = asyncio.Queue()
    tool_map = run.agent.tool_map
    todo = [use for use in todo if _settle_started(run, use) == "run"]
    # The once tools wait, past their before-call hooks, for one ledger commit of all of them.
    unsettled = {u["toolUseId"] for u in todo if _once(tool_map.get(u.get("name", "")))}
    ready: list[str] = []
    gate = asyncio.Event()

    def settle(tool_use_id: str, *, starts: bool) -> None:
        if tool_use_id not in unsettled:
            return
        unsettled.discard(tool_use_id)
        if starts:
            ready.append(tool_use_id)
        if not unsettled:
            queue.put_nowait(_GATE)

    async def one(use: dict[str, Any]) -> None:
        tool_use_id = use["toolUseId"]
        try:
            name = use.get("name", "")
            tool = tool_map.get(name)
            skipped = await _before_call(run, use, tool)
            if skipped is _SKIP:
                return
            if skipped is not None:
                run.results[run.key(use)] = skipped
                return
            once = _once(tool)
            if once:
                settle(tool_use_id, starts=True)
                await gate.wait()
                if run.cancel.immediate or run.aborted is not None:
                    run.started.pop(tool_use_id, None)
                    return
            queue.put_nowait(ToolStarted(tool_use_id, name))
            block = await _call(run, use, tool)
            if block is None:
                run.started.pop(tool_use_id, None)
                queue.put_nowait(ToolFinished(tool_use_id, name, _unfinished(run)))
                return
            run.results[run.key(use)] = block
            queue.put_nowait(ToolFinished(tool_use_id, name, result_status(block)))
            if once:
                run.started.pop(tool_use_id, None)
                queue.put_nowait(LedgerChanged(durable=False))
        finally:
            settle(tool_use_id, starts=False)
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
    (:func:`~service.agent.messages.name_shadowed`), which get no result."""
    todo = []
    invalid_ids = {use["toolUseId"] for use in run.uses if tool_name_error(use) is not None}
    for use in uses:
        key = run.key(use)
        if key in run.results:
            continue
        text = tool_name_error(use)
        if text is None:
            if not name_shadowed(use, invalid_ids):
                todo.append(use)
        else:
            # The name is the model's, of any length: measured like any result.
            tool_use_id = use["toolUseId"]
            run.results[key] = _checked(run, tool_use_id, error_result(tool_use_id, text))
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
            settled = _settle_started(run, use) if run.started else "run"
            if settled == "raised":
                break
            if settled == "done":
                continue
            name = use.get("name", "")
            tool = tool_map.get(name)
            skipped = await _before_call(run, use, tool)
            if skipped is _SKIP:
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
            block = await _call(run, use, tool)
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
        for use, key in result_order(run.uses, run.results):
            if key not in run.results:
                run.results[key] = error_result(use["toolUseId"], CANCELLED_TEXT)
    elif "" in run.raised:
        # As in the reference: a batch its before-tools hook interrupted never started.
        return
    if hooks.has(AfterToolsEvent):
        ordered = [
            run.results[key] for _, key in result_order(run.uses, run.results) if key in run.results
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
