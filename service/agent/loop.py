"""The ReAct loop: one invocation as an async generator of typed events.

Guarantees: a rejected input raises an EngineError before the first event and changes nothing;
the given state is never mutated; the last event is always :class:`Stopped` with a state whose
history is valid (roles alternate, every toolUse has exactly one toolResult once no batch is
pending, but for the calls of a reply that stopped for another reason than using tools, which
the next prompt answers ``Tool was interrupted.``); tools run only when the model stopped to use
them (an ``end_turn`` with tool calls counts as that, but not one standing for a stop reason
of the provider's that Cairn does not know), and a prompt that ends with the
assistant's tool calls runs them without a model call; boundaries passed without pausing are
reported as :class:`Boundary` events. The model is sent the agent's view of the history
(:mod:`service.agent.context`), never the history edited (but for tool names no tool can have,
sent as the reference's placeholder); a context overflow shrinks that view
and repeats the same call, until the call fits or nothing more can be cut (then the invocation
ends ``context_overflow``, its pause kept). A tool raising ``KeyboardInterrupt`` or
``SystemExit`` ends the invocation ``tool_aborted`` (:mod:`service.agent.aborts`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncIterator

from service.agent import tracing
from service.agent.batch import BatchRun, LedgerChanged
from service.agent.cancel import CancelSignal
from service.agent.definition import AgentDefinition
from service.agent.errors import ContextOverflowError, ModelError, ToolAbortedError
from service.agent.events import (
    CheckpointReached,
    Event,
    InterruptRaised,
    ModelMessage,
    ModelTextDelta,
)
from service.agent.executor import raised_in_order, run_batch
from service.agent.hooks import (
    AfterModelCallEvent,
    BeforeInvocationEvent,
    BeforeModelCallEvent,
)
from service.agent.interrupts import InterruptBook
from service.agent.invocation import Invocation, plan
from service.agent.messages import (
    asked_tools,
    for_model,
    results_message,
    tool_uses,
    unidentified_tool_use,
    with_inputs,
    without_tool_uses,
)
from service.agent.pause_cancel import resolve_cancel
from service.agent.provider import ModelReply, ModelRequest, TextDelta
from service.agent.results import CANCELLED_TEXT
from service.agent.run import InvocationRun
from service.agent.state import PendingBatch, SessionState
from service.agent.types import (
    Checkpoint,
    ErrorInfo,
    Message,
)

__all__ = ["Invocation", "resolve_cancel", "run_invocation"]

logger = logging.getLogger(__name__)


async def run_invocation(
    agent: AgentDefinition,
    state: SessionState,
    invocation: Invocation,
    *,
    cancel: CancelSignal | None = None,
    tracer: tracing.Tracer = tracing.NO_TRACING,
) -> AsyncIterator[Event]:
    """Run one invocation of ``agent`` on ``state``; see the module guarantees. ``tracer``
    gets a span per model call and per tool call (:mod:`service.agent.tracing`)."""
    p = plan(agent, state, invocation)
    run = InvocationRun(
        agent,
        state.snapshot(),
        invocation,
        p,
        cancel if cancel is not None else CancelSignal(),
        tracer,
    )
    ws, hooks, cancel_signal, metrics = run.ws, run.hooks, run.cancel, run.metrics
    ws.agent = agent.name
    checkpointing, limits = p.checkpointing, p.limits
    await run.abandon_pending()
    if hooks.has(BeforeInvocationEvent):
        await hooks.fire(
            BeforeInvocationEvent(
                agent, ws.session_id, invocation.input, run.inv_state, ws.agent_state
            )
        )
        run.check_state("before_invocation hook")
    await run.apply_input()
    step, cycle = p.start, p.cycle_index
    # Set once this invocation completed a batch: a cancel seen before the next model call is
    # then an after-tools cancel, not a cancelled model stream.
    last_batch: Message | None = None

    while True:
        if step == "model":
            if cancel_signal.is_set and last_batch is not None:
                # Observed right after this invocation's batch (the reference's after-tools
                # check): any cancel, deferred included, stops before the model call.
                yield await run.finish("cancelled", await run.cancel_after_model(last_batch))
                return
            message = asked_tools(ws.messages) if ws.pending is None else None
            if message is None:
                tripped = run.tripped_limit(limits)
                if tripped is not None:
                    # As in the reference, a limit result carries the last message of history.
                    last = ws.messages[-1] if tripped[1] is None and ws.messages else None
                    yield await run.finish(tripped[0], last, error=tripped[1])
                    return
                if cancel_signal.immediate:
                    yield await run.finish("cancelled", await run.cancel_message())
                    return
                request = ModelRequest(
                    messages=[],
                    system_prompt=agent.system_prompt,
                    tool_specs=agent.tool_specs,
                    cancel=cancel_signal,
                    deadline=run.model_deadline(limits),
                    session_id=ws.session_id,
                    conversation_length=len(ws.messages),
                )
                started = time.perf_counter()
                reply: ModelReply | None = None
                cancelled = False
                failure: ModelError | None = None
                try:
                    view = await run.context_view(request)
                    request.messages = for_model(view, ws.names.misnamed(ws.messages))
                except ModelError as exc:
                    # A summarizer cut short by a cancel is the cancel, not a failure.
                    cancelled = cancel_signal.immediate
                    failure = None if cancelled else exc
                called = failure is None and not cancelled
                if called:
                    if hooks.has(BeforeModelCallEvent):
                        await hooks.fire(
                            BeforeModelCallEvent(
                                agent, ws.session_id, request, invocation_state=run.inv_state
                            )
                        )
                    metrics.cycles += 1
                    model_name = agent.model.model_name
                    with run.tracer.span(
                        tracing.model_span_name(model_name),
                        tracing.model_call(model_name, ws.session_id, agent.name),
                    ) as model_span:
                        stream = agent.model.stream(request)
                        try:
                            async for chunk in stream:
                                # Only an immediate cancel cuts the stream; a deferred one waits.
                                if cancel_signal.immediate:
                                    cancelled = True
                                    break
                                if isinstance(chunk, TextDelta):
                                    yield ModelTextDelta(chunk.text)
                                elif chunk.stop_reason == "cancelled":
                                    cancelled = True
                                    break
                                else:
                                    reply = chunk
                        except ModelError as exc:
                            failure = exc
                        finally:
                            aclose = getattr(stream, "aclose", None)
                            if aclose is not None:
                                await aclose()
                        if failure is None and reply is None and not cancelled:
                            failure = ModelError("model stream ended without a reply")
                        elif (
                            failure is None
                            and reply is not None
                            and (problem := unidentified_tool_use(reply.message)) is not None
                        ):
                            # Its results could not be matched to its calls.
                            failure, reply = ModelError(problem), None
                        # A toolUse of a reply has an input, as the reference's stream gives it.
                        if (
                            reply is not None
                            and (filled := with_inputs(reply.message)) is not reply.message
                        ):
                            reply = dataclasses.replace(reply, message=filled)
                        tracing.model_outcome(model_span, reply, failure, cancelled=cancelled)
                if failure is not None:
                    metrics.model_ms += (time.perf_counter() - started) * 1000.0
                    if called and hooks.has(AfterModelCallEvent):
                        await hooks.fire(
                            AfterModelCallEvent(
                                agent,
                                ws.session_id,
                                None,
                                failure,
                                invocation_state=run.inv_state,
                            )
                        )
                    if isinstance(failure, ContextOverflowError) and not cancel_signal.immediate:
                        failure = await _reduce_or_fail(run, request, failure)
                        if failure is None:
                            # The same model call again, on the smaller view; not a new cycle.
                            if called:
                                metrics.cycles -= 1
                            continue
                    logger.warning(
                        "session_id=<%s>, error=<%s> | model call failed",
                        ws.session_id,
                        failure.message,
                    )
                    error = ErrorInfo(failure.code, failure.message)
                    yield await run.finish("error", None, error=error, keep=run.retry_pause())
                    return
                metrics.model_ms += (time.perf_counter() - started) * 1000.0
                if cancelled or reply is None:
                    if called and hooks.has(AfterModelCallEvent):
                        await hooks.fire(
                            AfterModelCallEvent(
                                agent,
                                ws.session_id,
                                None,
                                None,
                                True,
                                invocation_state=run.inv_state,
                            )
                        )
                    yield await run.finish("cancelled", await run.cancel_message())
                    return
                metrics.usage.add(reply.usage)
                if (
                    reply.stop_reason == "end_turn"
                    and tool_uses(reply.message)
                    and reply.unknown_stop_reason is None
                ):
                    # Some models end their turn while asking for tools: the tools run (not
                    # under a stop reason the provider gave that Cairn does not know). As in
                    # the reference, the after-model-call hooks already see ``tool_use``.
                    reply = dataclasses.replace(reply, stop_reason="tool_use")
                if hooks.has(AfterModelCallEvent):
                    await hooks.fire(
                        AfterModelCallEvent(
                            agent, ws.session_id, reply, invocation_state=run.inv_state
                        )
                    )
                added, stop = reply.message, reply.stop_reason
                if stop == "max_tokens":
                    # Calls cut off mid-way are not run: each becomes a line saying so.
                    added = without_tool_uses(added)
                message = await run.add(added)
                yield ModelMessage(message)
                if stop != "tool_use" or not tool_uses(message):
                    # Tools run only when the model stopped to use them; calls in a reply that
                    # stopped otherwise stay unanswered until the next prompt answers them.
                    yield await run.finish("end_turn" if stop == "tool_use" else stop, message)
                    return
            ws.pending = PendingBatch(message)
            ws.cycle_index = cycle
            if not cancel_signal.is_set:
                if checkpointing:
                    ws.checkpoint = Checkpoint("after_model", cycle)
                    yield CheckpointReached(ws.checkpoint)
                    yield await run.finish("checkpoint", message, checkpoint=ws.checkpoint)
                    return
                yield run.boundary("after_model", cycle)
            step = "tools"
            continue

        pending = ws.pending
        if pending is None:
            step = "model"
            continue
        message = pending.assistant_message
        uses = tool_uses(message)
        ws.cycle_index = cycle
        batch = BatchRun(
            agent,
            ws.session_id,
            message,
            uses,
            pending.results,
            InterruptBook(pending.interrupts),
            cancel_signal,
            run.inv_state,
            ws.agent_state,
            metrics,
            run.state_guard,
            invocation.result_max_bytes,
            started=pending.started,
            instance=invocation.instance,
            tracer=run.tracer,
            answered=pending.resume_answered(),
        )
        async for event in run_batch(batch):
            if isinstance(event, LedgerChanged):
                yield run.ledger(event.durable)
            else:
                yield event
        if batch.aborted is not None:
            # As the reference leaves it when its invocation raises: the tool calls unanswered.
            error = ErrorInfo(ToolAbortedError.code, batch.aborted)
            yield await run.finish("error", None, error=error)
            return
        if batch.stopped:
            # Cancel beats interrupt and checkpoint; the batch gave every toolUse a result.
            await run.add(results_message(uses, pending.results, CANCELLED_TEXT, batch.answered))
            ws.pending = None
            yield await run.finish("cancelled", await run.cancel_after_model(message))
            return
        if batch.raised:
            # Not stopped when its after-tools event was built, so the interrupt stands; a
            # cancel arriving after that finds the session paused, which resolve_cancel handles.
            raised = raised_in_order(batch)
            new_ids = {i.id for i in raised}
            pending.interrupts = [i for i in batch.book.answered() if i.id not in new_ids] + raised
            ws.checkpoint = None
            yield InterruptRaised(raised)
            yield await run.finish("interrupt", message, interrupts=raised)
            return
        await run.add(results_message(uses, pending.results, CANCELLED_TEXT, batch.answered))
        ws.pending = None
        if cancel_signal.is_set:
            # Came while the after-tools hooks ran, once the batch had all its results: the
            # after_tools boundary observes it, and it beats the checkpoint there.
            yield await run.finish("cancelled", await run.cancel_after_model(message))
            return
        if checkpointing:
            ws.checkpoint = Checkpoint("after_tools", cycle)
            yield CheckpointReached(ws.checkpoint)
            yield await run.finish("checkpoint", message, checkpoint=ws.checkpoint)
            return
        yield run.boundary("after_tools", cycle)
        last_batch = message
        cycle += 1
        step = "model"


async def _reduce_or_fail(
    run: InvocationRun, request: ModelRequest, overflow: ContextOverflowError
) -> ModelError | None:
    """None once the view was reduced (the call is retried), else the failure to report."""
    try:
        if await run.reduce_context(request):
            return None
    except ModelError as exc:
        return exc
    policy = run.agent.context
    return ContextOverflowError(
        f"the model's context window is exceeded and the context cannot be reduced further "
        f"(strategy {policy.strategy}, {len(request.messages)} messages sent): "
        f"{overflow.message}"
    )
