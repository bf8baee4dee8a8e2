"""Tool calls run only when the model stopped to use them, and a prompt that ends with the
assistant's tool calls runs them without a model call (SEMANTICS §3, as the reference)."""

from __future__ import annotations

import pytest
from engine_helpers import (
    call,
    check_history,
    invoke,
    make_agent,
    model_of,
    results_of,
    resume,
    roundtrip,
)

from service.agent.state import SessionState
from service.providers.scripted import ScriptedReply

INTERRUPTED = [{"text": "Tool was interrupted."}]


def new_state() -> SessionState:
    return SessionState(session_id="s-stops")


@pytest.mark.parametrize("stop", ["stop_sequence", "content_filtered", "guardrail_intervened"])
async def test_calls_in_a_reply_that_stopped_otherwise_are_not_run(stop: str) -> None:
    asked = ScriptedReply(
        text="let me", tool_calls=[call("echo", "e1", text="x")], stop_reason=stop
    )
    agent = make_agent([asked, "fine"], checkpointing=True, mode="sequential")
    out = await invoke(agent, new_state(), "go")
    assert out.stop == stop and out.checkpoint is None
    assert out.result.message == out.state.messages[-1]
    assert [block.get("toolUse", {}).get("name") for block in out.state.messages[-1]["content"]]
    assert model_of(agent).calls == 1
    # The next prompt answers the calls left open, then the model is asked again.
    out = await invoke(agent, out.state, "and now?")
    assert out.stop == "end_turn"
    opened = out.state.messages[2]
    assert results_of(opened)[0]["toolUseId"] == "e1"
    assert results_of(opened)[0]["content"] == INTERRUPTED
    assert opened["content"][-1] == {"text": "and now?"}
    check_history(out.state)


async def test_calls_cut_off_by_the_token_limit_become_text() -> None:
    asked = ScriptedReply(
        text="I will", tool_calls=[call("echo", "e1", text="x")], stop_reason="max_tokens"
    )
    agent = make_agent([asked, "fine"], checkpointing=False, mode="sequential")
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "max_tokens"
    assert out.state.messages[-1]["content"] == [
        {"text": "I will"},
        {
            "text": "The selected tool echo's tool use was incomplete due to maximum token "
            "limits being reached."
        },
    ]
    assert out.result.message == out.state.messages[-1]
    out = await invoke(agent, out.state, "go on")
    assert out.stop == "end_turn"
    check_history(out.state)


async def test_calls_in_a_reply_that_ended_its_turn_are_run() -> None:
    asked = ScriptedReply(tool_calls=[call("echo", "e1", text="x")], stop_reason="end_turn")
    agent = make_agent([asked, "fine"], checkpointing=False, mode="sequential")
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "end_turn" and model_of(agent).calls == 2
    assert results_of(out.state.messages[2])[0]["content"] == [{"text": "x"}]


def _ending_with_calls(prompt: str) -> list[dict[str, object]]:
    return [
        {"role": "user", "content": [{"text": prompt}]},
        {
            "role": "assistant",
            "content": [{"toolUse": {"toolUseId": "e1", "name": "echo", "input": {"text": "x"}}}],
        },
    ]


async def test_a_prompt_ending_with_tool_calls_runs_them_before_any_model_call() -> None:
    agent = make_agent(["done"], checkpointing=False, mode="sequential")
    out = await invoke(agent, new_state(), _ending_with_calls("go"))
    assert out.stop == "end_turn"
    assert model_of(agent).calls == 1
    [result] = results_of(out.state.messages[2])
    assert result["toolUseId"] == "e1" and result["content"] == [{"text": "x"}]
    assert out.state.messages[3]["content"] == [{"text": "done"}]
    check_history(out.state)


async def test_a_prompt_ending_with_tool_calls_pauses_after_model_without_calling_it() -> None:
    agent = make_agent(["done"], checkpointing=True, mode="sequential")
    out = await invoke(agent, new_state(), _ending_with_calls("go"))
    assert out.checkpoint == {"position": "after_model", "cycle_index": 0, "schema_version": "1.0"}
    assert model_of(agent).calls == 0
    assert out.result.message == out.state.messages[-1]


NAME_ERROR = [{"text": "Error: tool_name=<bad name> | invalid tool name pattern"}]


@pytest.mark.parametrize("executor", ["sequential", "concurrent"])
@pytest.mark.parametrize("bad_first", [True, False])
async def test_an_id_shared_with_an_invalid_name_gets_only_the_name_error(
    executor: str, bad_first: bool
) -> None:
    # As the reference's validator: every call of an id one invalid name holds is dropped from
    # the run, so that id's only result is the name error; the other calls run as ever.
    calls = [call("bad name", "x"), call("echo", "x", text="a")]
    batch = [*(calls if bad_first else calls[::-1]), call("echo", "y", text="b")]
    agent = make_agent(
        [ScriptedReply(tool_calls=batch), "done"],
        checkpointing=False,
        executor=executor,
        mode="sequential",
    )
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "end_turn"
    results = results_of(out.state.messages[2])
    assert [(r["toolUseId"], r["content"]) for r in results] == [
        ("x", NAME_ERROR),
        ("y", [{"text": "b"}]),
    ]
    check_history(out.state)


async def test_an_interrupting_call_repeated_under_one_id_lists_its_interrupt_once() -> None:
    # The sequential reference stops at the first call that raises: one interrupt.
    twice = ScriptedReply(
        tool_calls=[call("approve", "x", action="a"), call("approve", "x", action="a")]
    )
    agent = make_agent([twice, "done"], checkpointing=False, mode="sequential")
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "interrupt"
    assert [i.name for i in out.result.interrupts] == ["approval"]
    answer = [{"interruptResponse": {"interruptId": out.result.interrupts[0].id, "response": 1}}]
    out = await invoke(agent, out.state, answer)
    assert out.stop == "end_turn"
    assert [r["content"] for r in results_of(out.state.messages[2])] == [[{"text": "a:1"}]] * 2


async def test_a_tool_use_id_the_model_gave_twice_keeps_each_calls_result() -> None:
    twice = ScriptedReply(tool_calls=[call("echo", "x", text="a"), call("echo", "x", text="b")])
    for checkpointing in (False, True):
        agent = make_agent([twice, "done"], checkpointing=checkpointing, mode="sequential")
        out = await invoke(agent, new_state(), "go")
        while out.checkpoint is not None:
            out = await invoke(agent, roundtrip(out.state), resume(out))
        assert out.stop == "end_turn"
        assert [r["content"] for r in results_of(out.state.messages[2])] == [
            [{"text": "a"}],
            [{"text": "b"}],
        ]
