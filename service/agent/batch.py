"""What one tool batch runs with and reports: the batch's inputs and the books it keeps
(results, raised interrupts, the ledger of ``once`` tools), shared by the executor and the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from service.agent import tracing
from service.agent.cancel import CancelSignal
from service.agent.definition import AgentDefinition
from service.agent.interrupts import InterruptBook
from service.agent.messages import result_keys
from service.agent.metrics import InvocationMetrics
from service.agent.storable import StateGuard
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
    state_guard: StateGuard
    result_max_bytes: int | None = None
    """The invocation's ``result_max_bytes``: the largest tool result kept (None: no limit)."""
    started: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The ledger of ``once`` tools started without a result yet (the pending batch's)."""
    instance: str = ""
    """Who runs the batch, as the ledger records it."""
    tracer: tracing.Tracer = tracing.NO_TRACING
    """Gets a span per tool call."""
    answered: frozenset[str] = frozenset()
    """For a batch resumed from an interrupt, the toolUseIds with a result at the pause: their
    other calls neither run nor get a result (:func:`~service.agent.messages.resume_skipped`)."""
    raised: dict[str, Interrupt] = field(default_factory=dict)
    """Interrupts raised by this run, by the raising toolUse's result key (:meth:`key`; ""
    for the before-tools hook)."""
    stopped: bool = False
    """A cancel stopped this batch (decided when its after-tools event is built): every
    toolUse then has a result in ``results``, and no interrupt of it stays pending."""
    aborted: str | None = None
    """Why a tool's ``KeyboardInterrupt`` or ``SystemExit`` ended this batch (the
    ``tool_aborted`` error's message), else None: no tool starts after it, no after-tools
    event fires, and the batch's results are not kept."""
    settled: dict[str, ContentBlock | None] = field(default_factory=dict)
    """The answers to ``tool_outcome_unknown`` taken by this run, by toolUseId: the result block
    it gave, or None to run the tool again. The ledger entry is one per toolUseId, so one answer
    settles every call of a toolUseId the model repeated."""
    keys: dict[int, str] = field(default_factory=dict)
    """Each toolUse's result key (:func:`~service.agent.messages.result_keys`), by the
    toolUse's identity; made on first use."""

    def key(self, use: dict[str, Any]) -> str:
        """Where the result of ``use`` (one of ``uses``) is kept in ``results``."""
        if not self.keys:
            self.keys = {id(u): k for u, k in zip(self.uses, result_keys(self.uses), strict=True)}
        return self.keys[id(use)]


@dataclass(frozen=True, slots=True)
class LedgerChanged:
    """The ledger of ``once`` tools changed; ``durable``: no tool starts before it is committed
    (the loop turns it into a :class:`~service.agent.events.ToolLedger` with a state)."""

    durable: bool
