"""One tool call of a batch: its before-tool-call hooks, its tries, its span and its after-tool-call
hooks.

Guarantees: whatever the tool returns or raises (a stray ``CancelledError`` included) ends as a
result the session can store, no larger than ``result_max_bytes`` (else the error result of
``result_too_large_text``), and the agent-state writes of the tool that the session cannot store
are undone; a running tool is never killed (cancel is cooperative). A tool with ``timeout_s``
sees its cancel signal when it runs longer, then is abandoned with an error result; an
idempotent tool with ``retries`` runs again after it raised or timed out. A call gives no
result when it raised an interrupt (in ``run.raised``) or a ``KeyboardInterrupt`` or
``SystemExit`` (``run.aborted``); the batch around it (:mod:`service.agent.executor`) decides
what comes next.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from service.agent import tracing
from service.agent.aborts import ToolAborted, aborted_text, guarded
from service.agent.batch import BatchRun
from service.agent.cancel import CancelSignal
from service.agent.hooks import AfterToolCallEvent, BeforeToolCallEvent
from service.agent.interrupts import InterruptSignal
from service.agent.results import (
    TOOL_CANCELLED_TEXT,
    ToolFailure,
    error_result,
    escaped_failure,
    failure,
    missing_input,
    result_status,
    timeout_text,
    tool_result,
    unknown_tool_text,
)
from service.agent.storable import checked_result, state_refused
from service.agent.tools import Tool, ToolContext, ToolPolicy
from service.agent.types import ContentBlock

logger = logging.getLogger(__name__)


class ToolTimeoutError(Exception):
    """The tool ran longer than its ``timeout_s``."""


SKIP = object()
"""What :func:`before_call` gives for a call its before-tool-call hooks interrupted."""
TIMEOUT_GRACE_S = 1.0
"""How long a tool past its timeout may take to return once its cancel signal is set (at most
the timeout itself) before it is abandoned."""


async def before_call(run: BatchRun, use: dict[str, Any], tool: Tool | None) -> Any:
    """Fire before-tool-call hooks: None to go on, a result block to skip, SKIP if interrupted."""
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
        return SKIP
    if event.cancel_tool:
        text = event.cancel_tool if isinstance(event.cancel_tool, str) else TOOL_CANCELLED_TEXT
        block = checked(run, use["toolUseId"], error_result(use["toolUseId"], text))
        if hooks.has(AfterToolCallEvent):
            # As for a tool that ran: the after-tool-call hooks see (and may replace) the result.
            # No tool was selected to run, as the reference reports a skipped call.
            after = AfterToolCallEvent(
                run.agent,
                run.session_id,
                use,
                None,
                block,
                cancel_message=text,
                invocation_state=run.invocation_state,
            )
            await hooks.fire(after)
            block = checked(run, use["toolUseId"], after.result)
        return block
    return None


def checked(run: BatchRun, tool_use_id: str, block: Any) -> ContentBlock:
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
    tool_input = use["input"]
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


async def call(run: BatchRun, use: dict[str, Any], tool: Tool | None) -> ContentBlock | None:
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
    if "input" not in use:
        # Not run, the agent's tool or not: the reference fails on it before either.
        text, exception = missing_input()
        block = checked(run, tool_use_id, error_result(tool_use_id, text))
    elif tool is None:
        # The name is the model's: measured too, so no result escapes the maximum size.
        text = unknown_tool_text(name)
        block = checked(run, tool_use_id, error_result(tool_use_id, text))
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
        block = checked(run, tool_use_id, block)
        refused = _check_state(run, use)
        if refused is not None:
            # Rare: the explanation grows the result, so it is measured again.
            block = checked(run, tool_use_id, state_refused(block, refused))
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
            event = after(checked(run, tool_use_id, error_result(tool_use_id, text)), exception)
            await hooks.fire(event)
        # A hook may replace or edit the result: the session must be able to store that too.
        block = checked(run, tool_use_id, event.result)
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    status = result_status(block)
    run.metrics.tool(name, elapsed_ms, error=status == "error")
    span.set(tracing.TOOL_STATUS, status)
    if status == "error":
        span.failed(tracing.tool_error(block), exception)
    return block
