"""The demo agent, driven through the real engine: checkpoints, an interrupt, a cancellable job."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from service.agent.cancel import CancelSignal
from service.agent.definition import AgentDefinition
from service.agent.events import ModelTextDelta, Stopped, ToolFinished, ToolStarted
from service.agent.invocation import Invocation
from service.agent.loop import run_invocation
from service.agent.registry import load_agent_registry
from service.agent.state import SessionState
from service.agent.types import AgentResult
from service.demo.agents import demo_agent
from service.demo.tools import calculator, weather

TOUR = "What is 12 * (3 + 4), and the weather in Porto?"


async def _run(
    agent: AgentDefinition,
    state: SessionState,
    command_id: str,
    payload: Any,
    *,
    checkpointing: bool | None = None,
    cancel: CancelSignal | None = None,
) -> tuple[AgentResult, SessionState, list[Any]]:
    events: list[Any] = []
    invocation = Invocation(command_id, payload, checkpointing=checkpointing)
    async for event in run_invocation(agent, state, invocation, cancel=cancel):
        events.append(event)
    last = events[-1]
    assert isinstance(last, Stopped)
    return last.result, last.state, events


def _resume(result: AgentResult) -> dict[str, Any]:
    assert result.checkpoint is not None
    return {"checkpointResume": {"checkpoint": result.checkpoint.to_dict()}}


def _answer(result: AgentResult, response: Any) -> list[dict[str, Any]]:
    assert result.interrupts
    return [
        {"interruptResponse": {"interruptId": i.id, "response": response}}
        for i in result.interrupts
    ]


def _text(result: AgentResult) -> str:
    assert result.message is not None
    return " ".join(b["text"] for b in result.message["content"] if "text" in b)


async def test_tour_with_checkpoints_pauses_at_every_boundary_and_at_the_approval() -> None:
    agent = demo_agent()
    state = SessionState(session_id="s-tour")
    stops = []

    result, state, _ = await _run(agent, state, "c1", TOUR, checkpointing=True)
    stops.append((result.stop_reason, result.checkpoint.to_dict() if result.checkpoint else None))
    calls = [b["toolUse"] for b in result.message["content"] if "toolUse" in b]
    assert [c["name"] for c in calls] == ["calculator", "weather"]
    assert calls[0]["input"] == {"expression": "12 * (3 + 4)"}
    assert calls[1]["input"] == {"city": "Porto"}

    step = 2
    while result.stop_reason == "checkpoint":
        result, state, _ = await _run(agent, state, f"c{step}", _resume(result), checkpointing=True)
        stops.append(
            (result.stop_reason, result.checkpoint.to_dict() if result.checkpoint else None)
        )
        step += 1
    assert result.stop_reason == "interrupt"
    assert result.interrupts is not None
    assert result.interrupts[0].name == "approval"
    assert result.interrupts[0].reason["action"] == "share the summary with the team"

    result, state, _ = await _run(
        agent, state, "c-answer", _answer(result, True), checkpointing=True
    )
    assert result.stop_reason == "checkpoint"
    assert result.checkpoint is not None
    assert result.checkpoint.position == "after_tools"
    result, state, events = await _run(agent, state, "c-last", _resume(result), checkpointing=True)
    assert result.stop_reason == "end_turn"
    assert "12 * (3 + 4) = 84" in _text(result)
    assert "Porto" in _text(result)
    assert "shared it with the team" in _text(result)
    assert sum(isinstance(e, ModelTextDelta) for e in events) > 1

    positions = [
        (reason, (cp or {}).get("position"), (cp or {}).get("cycle_index")) for reason, cp in stops
    ]
    assert positions == [
        ("checkpoint", "after_model", 0),
        ("checkpoint", "after_tools", 0),
        ("checkpoint", "after_model", 1),
        ("interrupt", None, None),
    ]


async def test_a_refused_approval_is_reported_and_one_model_serves_many_sessions() -> None:
    agent = demo_agent()

    async def session(name: str, response: Any) -> str:
        state = SessionState(session_id=name)
        result, state, _ = await _run(agent, state, f"{name}-1", TOUR)
        assert result.stop_reason == "interrupt"
        result, state, _ = await _run(agent, state, f"{name}-2", _answer(result, response))
        assert result.stop_reason == "end_turn"
        return _text(result)

    texts = await asyncio.gather(*(session(f"s{n}", n % 2 == 0) for n in range(6)))
    for n, text in enumerate(texts):
        assert ("shared it with the team" in text) == (n % 2 == 0), text
        assert "not approved" in text or n % 2 == 0


async def test_the_slow_job_stops_at_a_cancel_and_keeps_its_real_result() -> None:
    agent = demo_agent()
    cancel = CancelSignal()
    state = SessionState(session_id="s-slow")
    invocation = Invocation("c1", "Run the slow job for 60 seconds")
    started = time.monotonic()
    events: list[Any] = []
    async with asyncio.timeout(10):
        async for event in run_invocation(agent, state, invocation, cancel=cancel):
            events.append(event)
            if isinstance(event, ToolStarted) and event.name == "slow_job":
                cancel.cancel("stop the job")
    assert time.monotonic() - started < 5
    stopped = events[-1]
    assert isinstance(stopped, Stopped)
    assert stopped.result.stop_reason == "cancelled"
    finished = [e for e in events if isinstance(e, ToolFinished)]
    assert [(e.name, e.status) for e in finished] == [("slow_job", "success")]
    results = [
        b["toolResult"] for m in stopped.state.messages for b in m["content"] if "toolResult" in b
    ]
    assert "cancelled" in results[0]["content"][0]["text"]


async def test_a_deferred_cancel_lets_the_job_finish_then_stops() -> None:
    agent = demo_agent()
    cancel = CancelSignal()
    invocation = Invocation("c1", "Run the slow job for 0.3 seconds")
    events: list[Any] = []
    async with asyncio.timeout(10):
        async for event in run_invocation(
            agent, SessionState(session_id="s-def"), invocation, cancel=cancel
        ):
            events.append(event)
            if isinstance(event, ToolStarted):
                cancel.cancel(after_current_tools=True)
    stopped = events[-1]
    assert stopped.result.stop_reason == "cancelled"
    results = [
        b["toolResult"] for m in stopped.state.messages for b in m["content"] if "toolResult" in b
    ]
    assert results[0]["content"][0]["text"] == "job finished after 0.3s"


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("17 * 23", "17 * 23 = 391"),
        ("7 / 2", "7 / 2 = 3.5"),
        ("-(2 ** 10) % 7", "-(2 ** 10) % 7 = 5"),
        ("6/3", "6/3 = 2"),
    ],
)
def test_calculator_evaluates_arithmetic(expression: str, expected: str) -> None:
    assert calculator(expression) == expected


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("1 / 0", "division by zero"),
        ("2 ** 100000", "exponent"),
        ("__import__('os')", "unsupported"),
        ("True + 1", "unsupported"),
        ("1 +", "not an arithmetic expression"),
        ("1" * 300, "longer than"),
    ],
)
def test_calculator_refuses_what_is_not_plain_arithmetic(expression: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        calculator(expression)


def test_weather_is_deterministic_and_bounded() -> None:
    first = weather("Lisbon", 2)
    assert first == weather(" lisbon ", 2) | {"city": "Lisbon"}
    assert first != weather("Lisbon", 3)
    assert -5 <= first["temperature_c"] <= 30
    with pytest.raises(ValueError):
        weather("Lisbon", 9)


def test_the_default_registry_path_loads_the_demo_agents() -> None:
    from service.settings import Settings

    registry = load_agent_registry(Settings().agents)
    assert set(registry) == {"demo", "demo-checkpointed"}
    assert registry["demo-checkpointed"].checkpointing
    assert {t.name for t in registry["demo"].tools} == {
        "calculator",
        "weather",
        "request_approval",
        "slow_job",
    }


@pytest.mark.parametrize(
    "weather_block",
    [
        {"json": {"city": "Oslo", "conditions": "windy", "temperature_c": 3.5}},
        {"text": '{"city": "Oslo", "conditions": "windy", "temperature_c": 3.5}'},
    ],
)
def test_the_final_answer_reads_tool_values_given_as_json_or_as_json_text(
    weather_block: dict[str, Any],
) -> None:
    from service.agent.provider import ModelRequest
    from service.demo.script import demo_reply

    uses = [("t1", "weather"), ("t2", "request_approval")]
    messages = [
        {"role": "user", "content": [{"text": "weather in Oslo?"}]},
        {
            "role": "assistant",
            "content": [{"toolUse": {"toolUseId": t, "name": n, "input": {}}} for t, n in uses],
        },
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": "t1",
                        "status": "success",
                        "content": [weather_block],
                    }
                },
                {
                    "toolResult": {
                        "toolUseId": "t2",
                        "status": "success",
                        "content": [{"text": '{"approved": true}'}],
                    }
                },
            ],
        },
    ]
    reply = demo_reply(ModelRequest(messages, None, [], CancelSignal()), 2)
    assert reply.text == (
        "Result: n/a. Forecast: windy, 3.5 °C in Oslo. I shared it with the team."
    )
