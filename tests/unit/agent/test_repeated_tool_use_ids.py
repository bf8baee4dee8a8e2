"""A toolUseId the model gave twice in one reply, in a batch resumed from an interrupt.

The reference keeps its resume state by toolUseId: the results completed before the pause stay,
and the resume runs only the calls whose toolUseId has no result yet. So a repeated id that had
a result at the pause ends with that result alone, the other call never run nor answered, on an
interrupt answer (after a checkpoint resume too) and on a cancelled one. Every expected value
was observed by running the same scenario through strands-agents 1.62.0.

The ledger of ``once`` tools is Cairn's own and is kept by toolUseId too: a crash between two
calls of one id, or during both, never runs either again without asking.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from engine_helpers import (
    ToolHookLog,
    answers,
    approve,
    call,
    check_history,
    echo,
    invoke,
    make_agent,
    resume,
    roundtrip,
)

from service.agent.cancel import CancelSignal
from service.agent.events import ToolLedger
from service.agent.loop import Invocation, resolve_cancel, run_invocation
from service.agent.outcomes import outcome_interrupt_id
from service.agent.state import SessionState
from service.agent.tools import tool

PAID: list[int] = []


@tool(inline=True, effect="once")
def pay(amount: int) -> str:
    """Pay ``amount`` (must not happen twice)."""
    PAID.append(amount)
    return f"paid {amount}"


TOOLS = [echo, approve, pay]


def approval(tool_use_id: str) -> str:
    """The reference's id of the ``approval`` interrupt of ``approve`` under ``tool_use_id``."""
    return f"v1:tool_call:{tool_use_id}:225d3982-9eb3-5ce9-93ca-f09a444307f7"


def ok(tool_use_id: str, text: str) -> dict[str, Any]:
    return {"toolUseId": tool_use_id, "status": "success", "content": [{"text": text}]}


def cancelled(tool_use_id: str) -> dict[str, Any]:
    return {
        "toolUseId": tool_use_id,
        "status": "error",
        "content": [{"text": "Tool execution cancelled"}],
    }


def user(*results: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": [{"toolResult": r} for r in results]}


DONE = {"role": "assistant", "content": [{"text": "done"}]}
X_THEN_ASK = [call("echo", "x", text="a"), call("approve", "x", action="b")]
X_ASK_X = [
    call("echo", "x", text="a"),
    call("approve", "y", action="b"),
    call("echo", "x", text="c"),
]


async def paused_on(
    batch: list[Any], *, executor: str = "sequential", checkpointing: bool = False
) -> tuple[Any, ToolHookLog, Any]:
    """The agent, its hook log (cleared) and the outcome paused on the batch's interrupt."""
    log = ToolHookLog()
    agent = make_agent(
        [batch, "done"],
        checkpointing=checkpointing,
        executor=executor,
        tools=TOOLS,
        hooks=[log],
        mode="sequential",
    )
    out = await invoke(agent, SessionState(session_id="s-repeat"), "go")
    if checkpointing:
        assert out.stop == "checkpoint"
        out = await invoke(agent, roundtrip(out.state), resume(out))
    assert out.stop == "interrupt"
    log.take()
    return agent, log, out


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("executor", ["sequential", "concurrent"])
async def test_a_resume_runs_no_call_of_an_id_that_has_a_result(
    executor: str, checkpointing: bool
) -> None:
    agent, log, out = await paused_on(X_THEN_ASK, executor=executor, checkpointing=checkpointing)
    assert [i.id for i in out.result.interrupts] == [approval("x")]
    assert out.state.pending is not None and list(out.state.pending.results) == ["x"]
    out = await invoke(agent, roundtrip(out.state), answers((approval("x"), "ok")))
    assert out.stop == ("checkpoint" if checkpointing else "end_turn")
    # The asking call never runs again: no tool-call hooks, one result for the id.
    assert log.take() == [
        ("before_tools", ["x", "x"]),
        ("after_tools", [ok("x", "a")]),
        ("added", user(ok("x", "a"))),
        *([] if checkpointing else [("added", DONE)]),
    ]
    assert out.state.messages[2] == user(ok("x", "a"))
    assert out.state.pending is None
    if checkpointing:
        out = await invoke(agent, roundtrip(out.state), resume(out))
    assert out.stop == "end_turn"
    assert out.state.messages[2:] == [user(ok("x", "a")), DONE]
    check_history(out.state, resumed_ids=frozenset({"x"}))


@pytest.mark.parametrize("checkpointing", [False, True])
async def test_a_repeat_after_the_interrupting_call_is_skipped_on_the_resume(
    checkpointing: bool,
) -> None:
    agent, log, out = await paused_on(X_ASK_X, checkpointing=checkpointing)
    out = await invoke(agent, roundtrip(out.state), answers((approval("y"), "ok")))
    calls = [entry for entry in log.take() if entry[0] in ("before_call", "after_tools")]
    assert calls == [
        ("before_call", "y", "approve"),
        ("after_tools", [ok("x", "a"), ok("y", "b:ok")]),
    ]
    assert out.state.messages[2] == user(ok("x", "a"), ok("y", "b:ok"))


async def test_each_pause_keeps_the_ids_answered_so_far() -> None:
    batch = [*X_ASK_X, call("approve", "z", action="d"), call("echo", "x", text="e")]
    agent, log, out = await paused_on(batch)
    out = await invoke(agent, roundtrip(out.state), answers((approval("y"), "ok")))
    assert [i.id for i in out.result.interrupts] == [approval("z")]
    assert [e[1] for e in log.take() if e[0] == "before_call"] == ["y", "z"]
    out = await invoke(agent, roundtrip(out.state), answers((approval("z"), "ok")))
    assert out.stop == "end_turn"
    assert [e[1] for e in log.take() if e[0] == "before_call"] == ["z"]
    assert out.state.messages[2] == user(ok("x", "a"), ok("y", "b:ok"), ok("z", "d:ok"))


async def test_every_call_of_an_id_without_a_result_at_the_pause_runs() -> None:
    batch = [
        call("approve", "y", action="b"),
        call("echo", "x", text="a"),
        call("echo", "x", text="c"),
    ]
    agent, _, out = await paused_on(batch)
    out = await invoke(agent, roundtrip(out.state), answers((approval("y"), "ok")))
    assert out.state.messages[2] == user(ok("y", "b:ok"), ok("x", "a"), ok("x", "c"))
    check_history(out.state)


@pytest.mark.parametrize(
    ("batch", "results"),
    [
        (X_THEN_ASK, [ok("x", "a")]),
        (X_ASK_X, [ok("x", "a"), cancelled("y")]),
    ],
)
async def test_a_cancelled_resume_answers_no_call_of_an_id_that_has_a_result(
    batch: list[Any], results: list[dict[str, Any]]
) -> None:
    agent, log, out = await paused_on(batch)
    ids = [i.id for i in out.result.interrupts]
    signal = CancelSignal()
    signal.cancel()
    out = await invoke(
        agent, roundtrip(out.state), answers(*((i, "ok") for i in ids)), cancel=signal
    )
    assert out.stop == "cancelled"
    assert log.take() == [
        ("before_tools", [u["toolUse"]["toolUseId"] for u in out.state.messages[1]["content"]]),
        ("after_tools", results),
        ("added", user(*results)),
    ]
    assert out.state.messages[2:] == [user(*results)]


@pytest.mark.parametrize(
    ("batch", "results"),
    [
        (X_THEN_ASK, [ok("x", "a")]),
        (X_ASK_X, [ok("x", "a"), cancelled("y")]),
    ],
)
async def test_cancelling_the_paused_session_leaves_what_a_cancelled_resume_leaves(
    batch: list[Any], results: list[dict[str, Any]]
) -> None:
    _, _, out = await paused_on(batch)
    _, state = resolve_cancel(roundtrip(out.state))
    assert state.pending is None
    assert state.messages[2:] == [user(*results)]


async def _crashed_at_ledger(events: AsyncGenerator[Any, None]) -> SessionState:
    """The state a kill -9 leaves right after the first ledger commit that is not yet durable
    (the invocation is dropped there); its command, redelivered, continues from it."""
    try:
        async for event in events:
            if isinstance(event, ToolLedger) and not event.durable:
                return roundtrip(event.state)
    finally:
        await events.aclose()
    raise AssertionError("the invocation ended without a ledger commit")


async def test_a_crash_in_a_resumed_batch_keeps_skipping_the_ids_answered_at_the_pause() -> None:
    PAID.clear()
    batch = [*X_ASK_X[:2], call("pay", "z", amount=1), X_ASK_X[2]]
    agent, _, out = await paused_on(batch)
    payload = answers((approval("y"), "ok"))
    # The resume stops right after the ledger commit that follows the once tool's result, as a
    # kill -9 there would; its command, redelivered, continues the batch from that commit.
    crashed = await _crashed_at_ledger(
        run_invocation(agent, roundtrip(out.state), Invocation("c-answer", payload))
    )
    assert crashed.pending is not None
    assert list(crashed.pending.results) == ["x", "y", "z"]
    out = await invoke(agent, crashed, payload, command_id="c-answer")
    assert out.stop == "end_turn"
    assert PAID == [1]
    assert out.state.messages[2] == user(ok("x", "a"), ok("y", "b:ok"), ok("z", "paid 1"))


@tool(effect="once")
async def pay_until_dropped(amount: int) -> str:
    """Pay ``amount``; the payment of 2 is still under way when its invocation is dropped."""
    PAID.append(amount)
    if PAID == [1, 2]:
        await asyncio.Event().wait()  # never set: the test drops the invocation here
    return f"paid {amount}"


async def test_a_once_call_still_running_when_its_repeat_got_its_result_is_not_run_again() -> None:
    # The model gave one toolUseId to two once calls; the concurrent executor starts both, the
    # first one's result is committed while the second still runs, then the instance dies.
    PAID.clear()
    twice = [call("pay_until_dropped", "p", amount=1), call("pay_until_dropped", "p", amount=2)]
    agent = make_agent(
        [twice, "done"], checkpointing=False, executor="concurrent", tools=[pay_until_dropped]
    )
    crashed = await _crashed_at_ledger(
        run_invocation(agent, SessionState("s-twice"), Invocation("c1", "go"))
    )
    assert crashed.pending is not None
    assert list(crashed.pending.results) == ["p"]
    assert list(crashed.pending.started) == ["p"], crashed.pending.started
    assert PAID == [1, 2]
    # The redelivered command continues the batch: the second call's outcome is unknown, so it
    # is asked about, under the interrupt of its toolUseId, and not run again.
    out = await invoke(agent, crashed, "go", command_id="c1")
    assert PAID == [1, 2]
    assert out.stop == "interrupt"
    [unknown] = out.result.interrupts
    assert unknown.name == "tool_outcome_unknown"
    assert unknown.reason["tool_use_id"] == "p"
    assert unknown.reason["input"] == {"amount": 2}


@pytest.mark.parametrize("executor", ["sequential", "concurrent"])
async def test_one_answer_about_a_repeated_once_id_settles_every_call_of_it(executor: str) -> None:
    # The instance dies once the ledger recorded the toolUseId as started, before any result:
    # the resume asks about the id, and its answer (a result: it happened) holds for each call.
    PAID.clear()
    twice = [call("pay", "p", amount=1), call("pay", "p", amount=2)]
    agent = make_agent([twice, "done"], checkpointing=False, executor=executor, tools=[pay])
    events = run_invocation(agent, SessionState("s-asked"), Invocation("c1", "go"))
    crashed = None
    try:
        async for event in events:
            if isinstance(event, ToolLedger) and event.durable:
                crashed = roundtrip(event.state)
                break
    finally:
        await events.aclose()
    assert crashed is not None and crashed.pending is not None
    assert list(crashed.pending.started) == ["p"]
    asked = await invoke(agent, crashed, "go", command_id="c1")
    assert asked.stop == "interrupt"
    assert {i.id for i in asked.result.interrupts} == {outcome_interrupt_id("p")}
    PAID.clear()
    paid = {"content": [{"text": "paid, checked"}]}
    out = await invoke(
        agent, roundtrip(asked.state), answers((outcome_interrupt_id("p"), {"result": paid}))
    )
    assert out.stop == "end_turn"
    assert PAID == []
    assert out.state.messages[2] == user(ok("p", "paid, checked"), ok("p", "paid, checked"))
