"""The ReAct loop: one invocation as an async generator of typed events.

Guarantees: a rejected input raises an EngineError before the first event and changes nothing;
the given state is never mutated; the last event is always :class:`Stopped` with a state whose
history is valid (roles alternate, every toolUse has exactly one toolResult once no batch is
pending); boundaries passed without pausing are reported as :class:`Boundary` events.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

from service.agent.cancel import CancelSignal
from service.agent.definition import AgentDefinition
from service.agent.errors import ModelError
from service.agent.events import (
    Boundary,
    CheckpointReached,
    Event,
    InterruptRaised,
    ModelMessage,
    ModelTextDelta,
    Stopped,
)
from service.agent.executor import BatchRun, raised_in_order, run_batch
from service.agent.hooks import (
    AfterInvocationEvent,
    AfterModelCallEvent,
    BeforeInvocationEvent,
    BeforeModelCallEvent,
    MessageAddedEvent,
)
from service.agent.interrupts import InterruptBook
from service.agent.invocation import Invocation, Plan, plan
from service.agent.messages import append_message, results_message, tool_uses
from service.agent.metrics import InvocationMetrics, add_to_turn, turn_cycles, turn_tokens
from service.agent.provider import ModelReply, ModelRequest, TextDelta
from service.agent.results import ABANDONED_TEXT, CANCELLED_TEXT
from service.agent.state import Inflight, PendingBatch, SessionState, clone_json
from service.agent.types import (
    AgentResult,
    Checkpoint,
    ErrorInfo,
    Interrupt,
    Limits,
    Message,
    StopReason,
)

__all__ = ["Invocation", "resolve_cancel", "run_invocation"]

logger = logging.getLogger(__name__)

_PAUSES = ("checkpoint", "interrupt")


class _Run:
    """Mutable context of one invocation; ``ws`` is the working copy of the session state."""

    __slots__ = ("agent", "cancel", "hooks", "inv_state", "invocation", "metrics", "plan", "ws")

    def __init__(
        self,
        agent: AgentDefinition,
        ws: SessionState,
        invocation: Invocation,
        p: Plan,
        cancel: CancelSignal,
    ) -> None:
        self.agent = agent
        self.ws = ws
        self.invocation = invocation
        self.plan = p
        self.cancel = cancel
        self.hooks = agent.hook_registry
        self.metrics = InvocationMetrics()
        self.inv_state = (
            invocation.invocation_state if invocation.invocation_state is not None else {}
        )

    async def add(self, message: Message) -> Message:
        added = append_message(self.ws.messages, message)
        if self.hooks.has(MessageAddedEvent):
            await self.hooks.fire(MessageAddedEvent(self.agent, self.ws.session_id, added))
        return added

    async def apply_input(self) -> None:
        p, ws = self.plan, self.ws
        if p.kind == "prompt":
            if ws.pending is not None:
                uses = tool_uses(ws.pending.assistant_message)
                await self.add(results_message(uses, ws.pending.results, ABANDONED_TEXT))
            ws.pending = None
            ws.checkpoint = None
            ws.inflight = None
            ws.cycle_index = 0
            ws.turn_metrics = {}
            ws.turn_started_at = time.time()
            ws.turn_checkpointing = p.checkpointing
            ws.turn_limits = p.limits.to_dict()
            for message in p.prompt:
                await self.add(message)
        elif p.kind == "resume":
            ws.checkpoint = None
        elif p.kind == "answers" and ws.pending is not None:
            for interrupt in ws.pending.interrupts:
                if interrupt.id in p.answers:
                    interrupt.response = p.answers[interrupt.id]

    def tripped_limit(self, limits: Limits) -> tuple[StopReason, ErrorInfo | None] | None:
        turn = self.ws.turn_metrics
        if limits.max_cycles is not None and (
            turn_cycles(turn) + self.metrics.cycles >= limits.max_cycles
        ):
            return "limit_turns", None
        if limits.max_tokens is not None and (
            turn_tokens(turn) + self.metrics.usage.total_tokens >= limits.max_tokens
        ):
            return "limit_total_tokens", None
        if (
            limits.deadline_s is not None
            and self.ws.turn_started_at is not None
            and time.time() - self.ws.turn_started_at >= limits.deadline_s
        ):
            return "error", ErrorInfo(
                "limit_exceeded", f"turn deadline of {limits.deadline_s}s passed"
            )
        return None

    def model_deadline(self, limits: Limits) -> float | None:
        if limits.deadline_s is None or self.ws.turn_started_at is None:
            return None
        remaining = self.ws.turn_started_at + limits.deadline_s - time.time()
        return time.monotonic() + remaining

    async def cancel_message(self) -> Message:
        return await self.add({"role": "assistant", "content": [{"text": self.cancel.message}]})

    async def finish(
        self,
        stop_reason: StopReason,
        message: Message | None,
        *,
        checkpoint: Checkpoint | None = None,
        interrupts: list[Interrupt] | None = None,
        error: ErrorInfo | None = None,
        keep: Checkpoint | None = None,
    ) -> Stopped:
        """Close the invocation; ``keep`` is a pause that stays valid after a failure."""
        ws = self.ws
        if stop_reason not in _PAUSES:
            ws.pending = None
            ws.checkpoint = keep
            checkpoint = keep
        ws.inflight = None
        invocation_metrics = self.metrics.to_dict()
        ws.turn_metrics = add_to_turn(ws.turn_metrics, invocation_metrics)
        ws.mark_applied(self.invocation.command_id)
        result = AgentResult(
            stop_reason=stop_reason,
            message=message,
            checkpoint=checkpoint,
            interrupts=interrupts,
            metrics={"invocation": invocation_metrics, "turn": ws.turn_metrics},
            state=clone_json(ws.agent_state),
            error=error,
        )
        if self.hooks.has(AfterInvocationEvent):
            await self.hooks.fire(AfterInvocationEvent(self.agent, ws.session_id, result))
        logger.debug(
            "session_id=<%s>, command_id=<%s>, stop_reason=<%s> | invocation stopped",
            ws.session_id,
            self.invocation.command_id,
            stop_reason,
        )
        return Stopped(result, ws)

    def retry_pause(self) -> Checkpoint | None:
        """The after_tools pause this invocation resumed, if a model failure leaves it valid.

        Under checkpointing the failed model call is the first thing such a resume does, so
        the session is exactly at that pause again and the same resume may be retried.
        """
        p = self.plan
        if (
            p.kind == "resume"
            and p.checkpoint is not None
            and p.checkpoint.position == "after_tools"
        ):
            return p.checkpoint
        return None

    def boundary(self, position: str, cycle: int) -> Boundary:
        self.ws.inflight = Inflight(self.invocation.command_id, position, cycle, False)
        return Boundary(position, cycle, self.ws.snapshot())


async def run_invocation(
    agent: AgentDefinition,
    state: SessionState,
    invocation: Invocation,
    *,
    cancel: CancelSignal | None = None,
) -> AsyncIterator[Event]:
    """Run one invocation of ``agent`` on ``state``; see the module guarantees."""
    p = plan(agent, state, invocation)
    run = _Run(
        agent, state.snapshot(), invocation, p, cancel if cancel is not None else CancelSignal()
    )
    ws, hooks, cancel_signal, metrics = run.ws, run.hooks, run.cancel, run.metrics
    ws.agent = agent.name
    checkpointing, limits = p.checkpointing, p.limits
    if hooks.has(BeforeInvocationEvent):
        await hooks.fire(
            BeforeInvocationEvent(
                agent, ws.session_id, invocation.input, run.inv_state, ws.agent_state
            )
        )
    await run.apply_input()
    step, cycle = p.start, p.cycle_index

    while True:
        if step == "model":
            tripped = run.tripped_limit(limits)
            if tripped is not None:
                yield await run.finish(tripped[0], None, error=tripped[1])
                return
            if cancel_signal.is_set:
                yield await run.finish("cancelled", await run.cancel_message())
                return
            request = ModelRequest(
                messages=list(ws.messages),
                system_prompt=agent.system_prompt,
                tool_specs=agent.tool_specs,
                cancel=cancel_signal,
                deadline=run.model_deadline(limits),
                session_id=ws.session_id,
            )
            if hooks.has(BeforeModelCallEvent):
                await hooks.fire(BeforeModelCallEvent(agent, ws.session_id, request))
            metrics.cycles += 1
            started = time.perf_counter()
            reply: ModelReply | None = None
            cancelled = False
            failure: ModelError | None = None
            stream = agent.model.stream(request)
            try:
                async for chunk in stream:
                    if cancel_signal.is_set:
                        cancelled = True
                        break
                    if isinstance(chunk, TextDelta):
                        yield ModelTextDelta(chunk.text)
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
            if failure is not None:
                metrics.model_ms += (time.perf_counter() - started) * 1000.0
                if hooks.has(AfterModelCallEvent):
                    await hooks.fire(AfterModelCallEvent(agent, ws.session_id, None, failure))
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
                if hooks.has(AfterModelCallEvent):
                    await hooks.fire(AfterModelCallEvent(agent, ws.session_id, None, None, True))
                yield await run.finish("cancelled", await run.cancel_message())
                return
            metrics.usage.add(reply.usage)
            if hooks.has(AfterModelCallEvent):
                await hooks.fire(AfterModelCallEvent(agent, ws.session_id, reply))
            message = await run.add(reply.message)
            yield ModelMessage(message)
            uses = tool_uses(message)
            if not uses:
                stop: StopReason = (
                    "end_turn" if reply.stop_reason == "tool_use" else reply.stop_reason
                )
                yield await run.finish(stop, message)
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
        )
        if not cancel_signal.is_set:
            async for event in run_batch(batch):
                yield event
        if cancel_signal.is_set:
            # Cancel beats interrupt and checkpoint: every toolUse gets a result now.
            await run.add(results_message(uses, pending.results, CANCELLED_TEXT))
            ws.pending = None
            yield await run.finish("cancelled", await run.cancel_message())
            return
        if batch.raised:
            raised = raised_in_order(batch)
            new_ids = {i.id for i in raised}
            pending.interrupts = [i for i in batch.book.answered() if i.id not in new_ids] + raised
            ws.checkpoint = None
            yield InterruptRaised(raised)
            yield await run.finish("interrupt", message, interrupts=raised)
            return
        await run.add(results_message(uses, pending.results, CANCELLED_TEXT))
        ws.pending = None
        if checkpointing:
            ws.checkpoint = Checkpoint("after_tools", cycle)
            yield CheckpointReached(ws.checkpoint)
            yield await run.finish("checkpoint", message, checkpoint=ws.checkpoint)
            return
        yield run.boundary("after_tools", cycle)
        cycle += 1
        step = "model"


def resolve_cancel(
    state: SessionState, message: str | None = None, *, command_id: str | None = None
) -> tuple[AgentResult, SessionState]:
    """Cancel a session outside any invocation, resolving its pause if it has one.

    Pending tools get ``Tool execution cancelled`` (completed results are kept), the cancel
    message ends the turn, and the pending checkpoint or interrupt becomes stale. A session
    with nothing paused is returned unchanged (with ``message`` None in the result).
    """
    ws = state.snapshot()
    reply: Message | None = None
    if ws.pending is not None or ws.checkpoint is not None or ws.inflight is not None:
        if ws.pending is not None:
            uses = tool_uses(ws.pending.assistant_message)
            append_message(ws.messages, results_message(uses, ws.pending.results, CANCELLED_TEXT))
        text = message or CancelSignal().message
        reply = append_message(ws.messages, {"role": "assistant", "content": [{"text": text}]})
        ws.pending = None
        ws.checkpoint = None
        ws.inflight = None
    if command_id:
        ws.mark_applied(command_id)
    result = AgentResult(
        stop_reason="cancelled",
        message=reply,
        metrics={"invocation": InvocationMetrics().to_dict(), "turn": ws.turn_metrics},
        state=clone_json(ws.agent_state),
    )
    return result, ws
