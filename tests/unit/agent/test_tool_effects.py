"""Tools with effects: the ledger of ``once`` tools, the ``tool_outcome_unknown`` interrupt and
its answers, timeouts and retries.

A crash is simulated the way the runtime sees one: the invocation is dropped right after the
engine asked for a ledger commit, and the state of that commit is what the next owner loads.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from service.agent.cancel import CancelSignal
from service.agent.errors import InvalidInputError
from service.agent.events import ToolFinished, ToolLedger, ToolStarted
from service.agent.loop import Invocation, resolve_cancel, run_invocation
from service.agent.outcomes import OUTCOME_UNKNOWN, answer_problem, outcome_interrupt_id
from service.agent.state import SessionState
from service.agent.tool_call import TIMEOUT_GRACE_S
from service.agent.tools import ToolContext, ToolPolicy, tool
from service.agent.types import Interrupt
from tests.unit.agent.engine_helpers import (
    answers,
    call,
    check_history,
    invoke,
    make_agent,
    resume,
    roundtrip,
)

CALLS: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def _fresh_calls() -> None:
    CALLS.clear()


@tool(inline=True, effect="once")
def pay(amount: int) -> str:
    """Pay ``amount`` (must not happen twice)."""
    CALLS["pay"] += 1
    return f"paid {amount}"


@tool(inline=True, effect="once")
def email(to: str) -> str:
    """Send an email."""
    CALLS["email"] += 1
    return f"sent to {to}"


@tool(inline=True)
def lookup(key: str) -> str:
    """Look ``key`` up (safe to repeat)."""
    CALLS["lookup"] += 1
    return f"value of {key}"


@tool
async def slow_lookup(key: str) -> str:
    """Look ``key`` up, slowly (safe to repeat)."""
    await asyncio.sleep(0.05)
    CALLS["slow_lookup"] += 1
    return f"value of {key}"


@tool(inline=True, effect="once")
def ask_first(amount: int, context: ToolContext) -> str:
    """Ask a human, then pay."""
    answer = context.interrupt("approval", reason={"amount": amount})
    CALLS["ask_first"] += 1
    return f"paid {amount} after {answer}"


EFFECT_TOOLS = [pay, email, lookup, slow_lookup, ask_first]
SCRIPT = [[call("pay", "t1", amount=5), call("lookup", "t2", key="k")], "all done"]


async def _until_ledger(
    agent: Any, state: SessionState, payload: Any, command_id: str, *, committed: int = 1
) -> SessionState:
    """Run until the ``committed``-th durable ledger commit and drop the invocation there, as a
    kill -9 right after that commit would; the state of that commit is returned."""
    invocation = Invocation(command_id, payload, instance="host-a:1")
    events = run_invocation(agent, state, invocation)
    seen = 0
    try:
        async for event in events:
            if isinstance(event, ToolLedger) and event.durable:
                seen += 1
                if seen == committed:
                    return roundtrip(event.state)
    finally:
        await events.aclose()
    raise AssertionError("no durable ledger commit")


def _agent(script: Any = SCRIPT, **options: Any) -> Any:
    return make_agent(script, tools=EFFECT_TOOLS, **options)


def _results(state: SessionState) -> list[dict[str, Any]]:
    return [b["toolResult"] for m in state.messages for b in m["content"] if "toolResult" in b]


def _unknown(outcome: Any) -> Interrupt:
    assert outcome.stop == "interrupt", outcome.result
    [interrupt] = outcome.result.interrupts
    assert interrupt.name == OUTCOME_UNKNOWN
    return interrupt


async def test_a_once_tool_starts_only_after_a_durable_ledger_commit_and_its_result_follows() -> (
    None
):
    out = await invoke(_agent(checkpointing=False), SessionState("s"), "go", command_id="c1")
    assert out.stop == "end_turn" and Counter({"pay": 1, "lookup": 1}) == CALLS
    kinds = [type(e).__name__ for e in out.events if isinstance(e, ToolLedger | ToolStarted)]
    assert kinds[:3] == ["ToolLedger", "ToolStarted", "ToolLedger"]
    first, second = out.of(ToolLedger)
    assert first.durable and not second.durable
    assert first.state.pending is not None and set(first.state.pending.started) == {"t1"}
    assert first.state.pending.started["t1"]["instance"] == ""
    assert "t1" not in first.state.pending.results
    assert first.state.inflight is not None and first.state.inflight.command_id == "c1"
    assert first.state.inflight.position == "after_model"
    assert second.state.pending is not None and not second.state.pending.started
    assert second.state.pending.results["t1"]["toolResult"]["content"] == [{"text": "paid 5"}]
    assert out.state.pending is None and out.state.inflight is None
    check_history(out.state)


async def test_only_once_tools_touch_the_ledger() -> None:
    script = [[call("lookup", "t1", key="a")], "done"]
    out = await invoke(_agent(script, checkpointing=False), SessionState("s"), "go")
    assert out.stop == "end_turn" and not out.of(ToolLedger)


@pytest.mark.parametrize("checkpointing", [False, True])
async def test_a_once_tool_found_started_is_not_run_again_but_asked_about(
    checkpointing: bool,
) -> None:
    agent = _agent(checkpointing=checkpointing)
    state, payload = SessionState("s"), "go"
    if checkpointing:
        paused = await invoke(agent, state, "go", command_id="c0")
        state, payload = paused.state, resume(paused)
    crashed = await _until_ledger(agent, state, payload, "c1")
    assert crashed.pending is not None and crashed.pending.started["t1"]["instance"] == "host-a:1"
    assert CALLS["pay"] == 0  # dropped before it ran; the next owner cannot know that
    out = await invoke(agent, crashed, payload, command_id="c1")
    interrupt = _unknown(out)
    assert interrupt.id == outcome_interrupt_id("t1")
    assert interrupt.reason == {
        "tool_name": "pay",
        "input": {"amount": 5},
        "tool_use_id": "t1",
        "idempotency_key": "s:t1",
        "started_at": crashed.pending.started["t1"]["at"],
        "instance": "host-a:1",
    }
    # Sequential: the batch stops at the question, as at any interrupt; the rest runs after.
    assert Counter() == CALLS
    assert out.state.pending is not None and not out.state.pending.results
    assert out.state.inflight is None
    assert roundtrip(out.state) == out.state


async def _paused_on_unknown(**options: Any) -> tuple[Any, Any]:
    agent = _agent(**options)
    crashed = await _until_ledger(agent, SessionState("s"), "go", "c1")
    return agent, await invoke(agent, crashed, "go", command_id="c1")


async def test_answered_with_a_result_the_model_sees_it_and_the_tool_never_runs() -> None:
    agent, paused = await _paused_on_unknown(checkpointing=False)
    supplied = {"result": {"content": [{"text": "bank says: paid"}], "status": "success"}}
    out = await invoke(agent, paused.state, answers((_unknown(paused).id, supplied)))
    assert out.stop == "end_turn"
    assert CALLS["pay"] == 0
    results = {
        b["toolResult"]["toolUseId"]: b["toolResult"]
        for m in out.state.messages
        for b in m["content"]
        if "toolResult" in b
    }
    assert results["t1"] == {
        "toolUseId": "t1",
        "status": "success",
        "content": [{"text": "bank says: paid"}],
    }
    check_history(out.state)


async def test_answered_with_retry_it_runs_again_under_a_new_ledger_entry() -> None:
    agent, paused = await _paused_on_unknown(checkpointing=False)
    out = await invoke(agent, paused.state, answers((_unknown(paused).id, {"retry": True})))
    assert out.stop == "end_turn"
    assert CALLS["pay"] == 1
    [started, finished] = out.of(ToolLedger)
    assert started.durable and started.state.pending is not None
    assert set(started.state.pending.started) == {"t1"}
    assert not finished.durable


async def test_answered_with_fail_the_model_sees_an_error_result() -> None:
    agent, paused = await _paused_on_unknown(checkpointing=False)
    out = await invoke(agent, paused.state, answers((_unknown(paused).id, {"fail": "declined"})))
    assert out.stop == "end_turn" and CALLS["pay"] == 0
    blocks = [
        b["toolResult"] for m in out.state.messages for b in m["content"] if "toolResult" in b
    ]
    assert {"toolUseId": "t1", "status": "error", "content": [{"text": "declined"}]} in blocks


@pytest.mark.parametrize(
    "response",
    [
        {},
        "yes",
        None,
        True,
        {"retry": False},
        {"retry": True, "fail": "x"},
        {"fail": ""},
        {"fail": 3},
        {"result": {"status": "success"}},
        {"result": {"content": "text"}},
        {"result": {"content": [], "status": "maybe"}},
        {"result": {"content": [], "extra": 1}},
        {"approve": True},
    ],
)
async def test_anything_else_is_refused_and_changes_nothing(response: Any) -> None:
    agent, paused = await _paused_on_unknown(checkpointing=False)
    before = roundtrip(paused.state)
    interrupt_id = _unknown(paused).id
    with pytest.raises(InvalidInputError, match=f"interrupt {interrupt_id}: "):
        await invoke(agent, paused.state, answers((interrupt_id, response)))
    assert answer_problem(response) is not None
    assert paused.state == before and CALLS["pay"] == 0


@pytest.mark.parametrize(
    ("response", "problem"),
    [
        (
            {"result": {"status": "success"}},
            "result: content is missing: it must be a list of blocks",
        ),
        ({"result": {"content": None}}, "result: content must be a list of blocks, not null"),
        ({"result": {"content": "text"}}, "result: content must be a list of blocks, not str"),
    ],
)
def test_a_refused_result_answer_says_what_is_missing_or_wrong(
    response: dict[str, Any], problem: str
) -> None:
    assert answer_problem(response) == problem


MAY_HAVE_RUN = (
    "Tool execution cancelled after the tool had started: it may have done its work, its "
    "outcome is unknown (idempotency key s:t1)"
)


async def test_a_cancel_of_the_pause_resolves_it_like_any_interrupt() -> None:
    # The once tool whose outcome is unknown is not said to be cancelled: it may have run.
    _, paused = await _paused_on_unknown(checkpointing=False)
    result, state = resolve_cancel(paused.state)
    assert result.stop_reason == "cancelled"
    blocks = [b["toolResult"] for m in state.messages for b in m["content"] if "toolResult" in b]
    by_id = {b["toolUseId"]: b for b in blocks}
    assert by_id["t1"]["content"] == [{"text": MAY_HAVE_RUN}]
    assert by_id["t1"]["status"] == "error"
    assert by_id["t2"]["content"] == [{"text": "Tool execution cancelled"}]
    assert state.pending is None and not state.interrupted
    check_history(state)


async def test_a_cancel_of_a_turn_left_while_a_once_tool_ran_says_it_may_have_run() -> None:
    # Its owner died while the tool ran, and a cancel covers the command: the next owner
    # closes the turn from the committed state, never pausing on tool_outcome_unknown.
    crashed = await _until_ledger(_agent(checkpointing=False), SessionState("s"), "go", "c1")
    assert crashed.inflight is not None and crashed.pending is not None
    assert "t1" in crashed.pending.started
    result, state = resolve_cancel(crashed)
    assert result.stop_reason == "cancelled"
    blocks = [b["toolResult"] for m in state.messages for b in m["content"] if "toolResult" in b]
    assert {b["toolUseId"]: b["content"] for b in blocks}["t1"] == [{"text": MAY_HAVE_RUN}]
    assert CALLS["pay"] == 0  # recorded as started, cut off there; the cancel runs nothing
    check_history(state)


async def test_the_concurrent_executor_records_its_once_tools_in_one_commit() -> None:
    script = [
        [
            call("pay", "t1", amount=1),
            call("email", "t2", to="a@b"),
            call("slow_lookup", "t3", key="k"),
        ],
        "done",
    ]
    agent = _agent(script, checkpointing=False, executor="concurrent")
    out = await invoke(agent, SessionState("s"), "go", command_id="c1")
    assert out.stop == "end_turn" and Counter({"pay": 1, "email": 1, "slow_lookup": 1}) == CALLS
    ledgers = out.of(ToolLedger)
    durable = [e for e in ledgers if e.durable]
    assert len(durable) == 1
    assert durable[0].state.pending is not None
    assert set(durable[0].state.pending.started) == {"t1", "t2"}
    first_once_start = next(
        i
        for i, e in enumerate(out.events)
        if isinstance(e, ToolStarted) and e.tool_use_id in {"t1", "t2"}
    )
    assert out.events.index(durable[0]) < first_once_start
    assert len([e for e in ledgers if not e.durable]) == 2

    crashed = await _until_ledger(agent, SessionState("s2"), "go", "c2")
    CALLS.clear()
    again = await invoke(agent, crashed, "go", command_id="c2")
    assert again.stop == "interrupt"
    assert {i.name for i in again.result.interrupts} == {OUTCOME_UNKNOWN}
    assert {i.reason["tool_use_id"] for i in again.result.interrupts} == {"t1", "t2"}
    # The idempotent tool, still running at the crash, ran again without asking.
    assert Counter({"slow_lookup": 1}) == CALLS
    both = answers(
        (outcome_interrupt_id("t1"), {"retry": True}),
        (outcome_interrupt_id("t2"), {"fail": "bounced"}),
    )
    done = await invoke(agent, again.state, both)
    assert done.stop == "end_turn" and Counter({"slow_lookup": 1, "pay": 1}) == CALLS


async def test_a_once_tool_that_interrupts_leaves_no_ledger_entry() -> None:
    script = [[call("ask_first", "t1", amount=9)], "done"]
    agent = _agent(script, checkpointing=False)
    out = await invoke(agent, SessionState("s"), "go")
    assert out.stop == "interrupt"
    assert out.state.pending is not None and not out.state.pending.started
    [interrupt] = out.result.interrupts
    done = await invoke(agent, out.state, answers((interrupt.id, "yes")))
    assert done.stop == "end_turn" and CALLS["ask_first"] == 1


async def test_a_cancel_during_the_ledger_commit_keeps_the_tool_from_starting() -> None:
    agent = _agent(checkpointing=False)
    cancel = CancelSignal()
    events = run_invocation(agent, SessionState("s"), Invocation("c1", "go"), cancel=cancel)
    seen = []
    async for event in events:
        seen.append(event)
        if isinstance(event, ToolLedger) and event.durable:
            cancel.cancel()
    assert CALLS["pay"] == 0
    last = seen[-1]
    assert last.result.stop_reason == "cancelled"  # type: ignore[union-attr]
    assert not any(isinstance(e, ToolStarted) and e.tool_use_id == "t1" for e in seen)


async def test_a_tool_past_its_timeout_sees_its_cancel_signal_then_gets_an_error_result() -> None:
    seen: list[str] = []

    @tool(timeout_s=0.05)
    async def polite(context: ToolContext) -> str:
        """Wait for the cancel signal."""
        await context.cancel.wait()
        seen.append(context.cancel.message)
        return "stopped"

    @tool(timeout_s=0.05)
    async def stubborn() -> str:
        """Ignore every signal."""
        await asyncio.sleep(30)
        return "late"

    script = [[call("polite", "t1"), call("stubborn", "t2")], "done"]
    agent = make_agent(script, tools=[polite, stubborn], checkpointing=False)
    started = asyncio.get_running_loop().time()
    out = await invoke(agent, SessionState("s"), "go")
    assert asyncio.get_running_loop().time() - started < 5 * TIMEOUT_GRACE_S
    assert out.stop == "end_turn"
    assert seen == ["timed out after 0.05 s"]
    blocks = [
        b["toolResult"] for m in out.state.messages for b in m["content"] if "toolResult" in b
    ]
    assert [b["content"] for b in blocks] == [
        [{"text": "Error: tool polite timed out after 0.05 s"}],
        [{"text": "Error: tool stubborn timed out after 0.05 s"}],
    ]
    assert {b["status"] for b in blocks} == {"error"}
    assert [e.status for e in out.of(ToolFinished)] == ["error", "error"]


async def test_an_idempotent_tool_is_retried_after_it_raised_and_a_once_tool_never() -> None:
    tries: Counter[str] = Counter()

    @tool(inline=True, retries=2, backoff=0)
    def flaky(label: str) -> str:
        """Fail twice, then work."""
        tries[label] += 1
        if tries[label] < 3:
            raise ConnectionError("try again")
        return "worked"

    @tool(inline=True, retries=1, backoff=0)
    def broken() -> str:
        """Always fail."""
        tries["broken"] += 1
        raise RuntimeError("down")

    script = [[call("flaky", "t1", label="x"), call("broken", "t2")], "done"]
    out = await invoke(make_agent(script, tools=[flaky, broken]), SessionState("s"), "go")
    assert out.stop == "checkpoint"
    out = await invoke(make_agent(script, tools=[flaky, broken]), out.state, resume(out))
    assert tries == Counter({"x": 3, "broken": 2})
    blocks = [
        b["toolResult"] for m in out.state.messages for b in m["content"] if "toolResult" in b
    ]
    assert blocks[0]["content"] == [{"text": "worked"}]
    assert blocks[1]["content"] == [{"text": "Error: RuntimeError - down"}]
    with pytest.raises(ValueError, match="only to idempotent"):
        tool(effect="once", retries=1)(lambda: None)


async def test_a_retry_waits_its_backoff_and_a_cancel_stops_the_retries() -> None:
    tries: list[float] = []
    loop = asyncio.get_running_loop()

    @tool(retries=5, backoff=0.05)
    async def failing() -> str:
        """Fail every time."""
        tries.append(loop.time())
        raise RuntimeError("no")

    script = [[call("failing", "t1")], "done"]
    agent = make_agent(script, tools=[failing], checkpointing=False)
    cancel = CancelSignal()

    async def cancel_soon() -> None:
        while len(tries) < 3:
            await asyncio.sleep(0.01)
        cancel.cancel()

    canceller = asyncio.create_task(cancel_soon())
    out = await invoke(agent, SessionState("s"), "go", cancel=cancel)
    await canceller
    assert out.stop == "cancelled"
    assert len(tries) == 3
    assert tries[1] - tries[0] >= 0.05 and tries[2] - tries[1] >= 0.1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"effect": "twice"}, "effect must be one of"),
        ({"timeout_s": 0}, "timeout_s must be a positive number"),
        ({"timeout_s": float("inf")}, "timeout_s must be a positive number"),
        ({"retries": -1}, "retries must be a whole number"),
        ({"retries": True}, "retries must be a whole number"),
        ({"backoff_s": -1}, "backoff must be a number of seconds"),
    ],
)
def test_a_policy_out_of_range_is_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ToolPolicy(**options)


async def test_a_retry_cut_short_again_is_asked_about_again_not_run_a_third_time() -> None:
    agent, paused = await _paused_on_unknown(checkpointing=False)
    retry = answers((_unknown(paused).id, {"retry": True}))
    # The retried run is recorded as started, then its owner dies too.
    crashed = await _until_ledger(agent, paused.state, retry, "c2")
    assert crashed.pending is not None and "t1" in crashed.pending.started
    out = await invoke(agent, crashed, retry, command_id="c2")
    again = _unknown(out)
    assert again.reason["started_at"] == crashed.pending.started["t1"]["at"]
    assert again.response is None
    assert CALLS["pay"] == 0
    done = await invoke(agent, out.state, answers((again.id, {"fail": "gave up"})))
    assert done.stop == "end_turn" and CALLS["pay"] == 0
