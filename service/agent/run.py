"""The mutable context of one running invocation and the steps that edit its session state.

Only the loop drives it; every history edit goes through :meth:`InvocationRun.add`, so the
message-added hook sees each message once and roles never repeat; the agent state it returns is
storable, in the form a restored session holds it.
"""

from __future__ import annotations

import logging
import time

from service.agent import context as ctx
from service.agent.cancel import CancelSignal
from service.agent.definition import AgentDefinition
from service.agent.events import Boundary, Stopped, ToolLedger
from service.agent.hooks import AfterInvocationEvent, MessageAddedEvent
from service.agent.invocation import Invocation, Plan
from service.agent.messages import append_message, asked_tools, results_message, tool_uses
from service.agent.metrics import InvocationMetrics, add_to_turn, turn_cycles, turn_tokens
from service.agent.provider import ModelRequest
from service.agent.results import ABANDONED_TEXT
from service.agent.state import Inflight, SessionState
from service.agent.storable import StateGuard
from service.agent.tracing import NO_TRACING, Tracer
from service.agent.types import (
    AgentResult,
    Checkpoint,
    ErrorInfo,
    Interrupt,
    Limits,
    Message,
    StopReason,
)

logger = logging.getLogger(__name__)

_PAUSES = ("checkpoint", "interrupt")


class InvocationRun:
    """Mutable context of one invocation; ``ws`` is the working copy of the session state."""

    __slots__ = (
        "agent",
        "cancel",
        "hooks",
        "inv_state",
        "invocation",
        "metrics",
        "plan",
        "state_guard",
        "tracer",
        "ws",
    )

    def __init__(
        self,
        agent: AgentDefinition,
        ws: SessionState,
        invocation: Invocation,
        p: Plan,
        cancel: CancelSignal,
        tracer: Tracer = NO_TRACING,
    ) -> None:
        self.agent = agent
        self.tracer = tracer
        self.ws = ws
        self.invocation = invocation
        self.plan = p
        self.cancel = cancel
        self.hooks = agent.hook_registry
        self.metrics = InvocationMetrics()
        self.inv_state = (
            invocation.invocation_state if invocation.invocation_state is not None else {}
        )
        self.state_guard = StateGuard(ws.agent_state)

    async def add(self, message: Message) -> Message:
        added = append_message(self.ws.messages, message)
        if self.hooks.has(MessageAddedEvent):
            # The message given, as the reference reports it, not the one it joined in history.
            await self.hooks.fire(MessageAddedEvent(self.agent, self.ws.session_id, message))
        return added

    async def abandon_pending(self) -> None:
        """A new prompt abandons a pending batch, or the tool calls of a reply that stopped for
        another reason than using them: those toolUses get ``Tool was interrupted.``.

        Runs before the before-invocation hook, as in the reference, where these results are
        part of turning the prompt into messages, which precedes the invocation proper.
        """
        ws = self.ws
        if self.plan.kind != "prompt":
            return
        if ws.pending is not None:
            uses = tool_uses(ws.pending.assistant_message)
            await self.add(results_message(uses, ws.pending.results, ABANDONED_TEXT))
            ws.pending = None
        elif (unanswered := asked_tools(ws.messages)) is not None:
            await self.add(results_message(tool_uses(unanswered), {}, ABANDONED_TEXT))

    def check_state(self, writer: str) -> None:
        """Revert what ``writer`` (a hook) put in agent state that the session cannot store.

        A hook has no result to report the refusal in, so it is logged; the invocation goes on
        with the state as it was before that write.
        """
        reason = self.state_guard.check()
        if reason is not None:
            logger.warning(
                "session_id=<%s>, writer=<%s>, reason=<%s> | agent state write reverted",
                self.ws.session_id,
                writer,
                reason,
            )

    async def apply_input(self) -> None:
        p, ws = self.plan, self.ws
        if p.kind == "prompt":
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
        if p.kind in ("resume", "answers"):
            # What a resume sets holds for the rest of its turn, as an invoke's does.
            ws.turn_checkpointing = p.checkpointing
            ws.turn_limits = p.limits.to_dict()

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
        """The text that replaces a cancelled model reply: the cancel's message or the default."""
        return await self.add({"role": "assistant", "content": [{"text": self.cancel.message}]})

    async def cancel_after_model(self, last: Message) -> Message:
        """The result message of a cancel observed after the model replied.

        As in the reference: the cancel's own message is appended as assistant text; without
        one nothing is appended and the result carries the model's last message.
        """
        text = self.cancel.custom_message
        if text is None:
            return last
        return await self.add({"role": "assistant", "content": [{"text": text}]})

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
        result = AgentResult(
            stop_reason=stop_reason,
            message=message,
            checkpoint=checkpoint,
            interrupts=interrupts,
            metrics={"invocation": invocation_metrics, "turn": ws.turn_metrics},
            state=ws.agent_state,
            error=error,
        )
        if self.hooks.has(AfterInvocationEvent):
            await self.hooks.fire(
                AfterInvocationEvent(
                    self.agent, ws.session_id, result, invocation_state=self.inv_state
                )
            )
            self.check_state("after_invocation hook")
        # Kept in stored form, so this process goes on with exactly what a restore would load.
        ws.agent_state = result.state = self.state_guard.stored()
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

    async def context_view(self, request: ModelRequest) -> list[Message]:
        """The messages of the next model call, by the agent's context policy.

        Moves the session's view forward first when the policy asks for it (a window that
        slid, a summary written); what it decides is kept in the session state, so the same
        history gives the same view after a resume on any instance. A summarizer failure
        raises :class:`ModelError`.
        """
        policy, ws = self.agent.context, self.ws
        if policy.strategy == "none":
            return list(ws.messages)
        state = ws.context or ctx.ContextState()
        summary = state.summary is not None
        if policy.strategy == "sliding_window":
            start = ctx.window_start(ws.messages, state, policy.max_messages, summary)
            if start is not None and start > state.start:
                ws.context = ctx.ContextState(start, None)
        elif ctx.view_size(ws.messages, state.start, summary) > policy.max_messages:
            end = ctx.summary_start(ws.messages, state, policy.keep_recent)
            if end is not None:
                await self._summarize(state, end, request)
        return ctx.build_view(ws.messages, ws.context)

    async def reduce_context(self, request: ModelRequest) -> bool:
        """Shrink the view after the model's context overflowed; False when it cannot shrink."""
        policy, ws = self.agent.context, self.ws
        if policy.strategy == "none":
            return False
        state = ws.context or ctx.ContextState()
        start = ctx.smaller_start(ws.messages, state)
        if start is None:
            return False
        if policy.strategy == "sliding_window":
            ws.context = ctx.ContextState(start, None)
        else:
            await self._summarize(state, start, request)
        logger.info(
            "session_id=<%s>, strategy=<%s>, start=<%d>, messages=<%d> | context reduced",
            ws.session_id,
            policy.strategy,
            start,
            len(ws.messages),
        )
        return True

    async def _summarize(self, state: ctx.ContextState, end: int, request: ModelRequest) -> None:
        policy, ws = self.agent.context, self.ws
        helper = policy.summarizer
        model = helper.model if helper is not None else self.agent.model
        prompt = helper.system_prompt if helper is not None else None
        asked = ctx.summary_request(ws.messages, state, end)
        blocks, usage = await ctx.write_summary(model, prompt, asked, request)
        self.metrics.usage.add(usage)
        ws.context = ctx.ContextState(end, blocks)
        logger.info(
            "session_id=<%s>, summarized=<%d>, start=<%d> | context summarized",
            ws.session_id,
            end - state.start,
            end,
        )

    def boundary(self, position: str, cycle: int) -> Boundary:
        self.ws.inflight = Inflight(self.invocation.command_id, position, cycle, False)
        return Boundary(position, cycle, self._durable_snapshot())

    def ledger(self, durable: bool) -> ToolLedger:
        """The state to commit when the batch's ledger of ``once`` tools changed: its in-flight
        marker continues this batch (with this invocation's checkpointing) after a crash."""
        ws = self.ws
        ws.inflight = Inflight(
            self.invocation.command_id, "after_model", ws.cycle_index, self.plan.checkpointing
        )
        return ToolLedger(self._durable_snapshot(), durable)

    def _durable_snapshot(self) -> SessionState:
        snapshot = self.ws.snapshot()
        # The committed turn totals include this invocation so far: a run recovered from here
        # keeps counting the turn's limits from here, not from before the crash.
        snapshot.turn_metrics = add_to_turn(snapshot.turn_metrics, self.metrics.to_dict())
        return snapshot
