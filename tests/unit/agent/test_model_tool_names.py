"""A tool name no tool can have reaches the model as the reference's placeholder.

Observed with strands-agents 1.62.0 (a scripted ``Model`` recording what ``stream`` is sent): the
assistant's toolUse named ``bad name!`` is sent as ``INVALID_TOOL_NAME`` on the next model call,
while ``agent.messages`` keeps ``bad name!`` and its error result names it.
"""

from __future__ import annotations

from typing import Any

from engine_helpers import TOOLS, call, invoke, make_agent, model_of

from service.agent.context import SUMMARY_PROMPT, ContextPolicy
from service.agent.definition import AgentDefinition
from service.agent.state import SessionState
from service.providers.scripted import ScriptedModel

LONG = "a" * 65


def names(message: dict[str, Any]) -> list[Any]:
    return [b["toolUse"].get("name") for b in message["content"] if "toolUse" in b]


async def test_the_model_is_sent_the_placeholder_and_the_history_keeps_the_name() -> None:
    batch = [call("bad name!", "x1", q=1), call("echo", "e1", text="a"), call(LONG, "x2")]
    agent = make_agent([batch, "done"], checkpointing=False)
    state = SessionState(session_id="s-names")
    out = await invoke(agent, state, "hi")

    assert out.stop == "end_turn"
    requests = model_of(agent).requests
    sent = requests[1].messages[1]
    assert names(sent) == ["INVALID_TOOL_NAME", "echo", "INVALID_TOOL_NAME"]
    assert [b["toolUse"]["input"] for b in sent["content"]] == [{"q": 1}, {"text": "a"}, {}]
    assert names(out.state.messages[1]) == ["bad name!", "echo", LONG]
    results = out.state.messages[2]["content"]
    assert results[0]["toolResult"]["content"] == [
        {"text": "Error: tool_name=<bad name!> | invalid tool name pattern"}
    ]


async def test_a_tool_use_without_a_name_is_sent_with_the_placeholder() -> None:
    nameless = {"role": "assistant", "content": [{"toolUse": {"toolUseId": "m1", "input": {}}}]}
    agent = make_agent([nameless, "done"], checkpointing=False)
    out = await invoke(agent, SessionState(session_id="s-nameless"), "hi")

    assert out.stop == "end_turn"
    assert names(model_of(agent).requests[1].messages[1]) == ["INVALID_TOOL_NAME"]
    assert names(out.state.messages[1]) == [None]


async def test_the_summarizer_is_sent_the_placeholder_too() -> None:
    model = ScriptedModel(
        [[call("bad name!", "x1")], "one", "The user said hi.", "two"], record=True
    )
    agent = AgentDefinition(
        name="tester",
        model=model,
        tools=list(TOOLS),
        checkpointing=False,
        context=ContextPolicy("summarize", max_messages=4, keep_recent=2),
    )
    out = await invoke(agent, SessionState(session_id="s-sum"), "hi")
    out = await invoke(agent, out.state, "again")

    assert out.stop == "end_turn"
    [asked] = [r for r in model.requests if r.system_prompt == SUMMARY_PROMPT]
    assert [names(m) for m in asked.messages if names(m)] == [["INVALID_TOOL_NAME"]]
    assert names(out.state.messages[1]) == ["bad name!"]


def test_only_the_messages_renamed_are_copied() -> None:
    from service.agent.messages import for_model  # here, so only this test needs the helper

    user = {"role": "user", "content": [{"text": "hi"}]}
    good = {"role": "assistant", "content": [{"toolUse": {"toolUseId": "1", "name": "ok"}}]}
    bad = {"role": "assistant", "content": [{"text": "x"}, {"toolUse": {"toolUseId": "2"}}]}
    history = [user, good, bad]
    unchanged = history[:2]
    assert for_model(unchanged) is unchanged
    sent = for_model(history)
    assert sent[0] is user and sent[1] is good
    assert sent[2] == {
        "role": "assistant",
        "content": [{"text": "x"}, {"toolUse": {"toolUseId": "2", "name": "INVALID_TOOL_NAME"}}],
    }
    assert bad == {"role": "assistant", "content": [{"text": "x"}, {"toolUse": {"toolUseId": "2"}}]}


async def test_a_misnamed_call_of_an_earlier_command_is_still_sent_renamed() -> None:
    # The names are checked once per message, and the check is kept with the session across
    # its commands; a session decoded afresh (a deep copy here) is checked from its start.
    # (The scripted model plays its script again at each turn: every turn asks for the tool.)
    agent = make_agent([[call("bad name!", "x1")], "done"], checkpointing=False)
    out = await invoke(agent, SessionState(session_id="s-later"), "hi")
    out = await invoke(agent, out.state, "again")
    out = await invoke(agent, out.state.copy(), "once more")

    assert out.stop == "end_turn"
    sent = [[names(m) for m in r.messages if names(m)] for r in model_of(agent).requests]
    assert sent == [[["INVALID_TOOL_NAME"]] * count for count in (0, 1, 1, 2, 2, 3)]
    assert [names(m) for m in out.state.messages if names(m)] == [["bad name!"]] * 3


def test_the_name_check_follows_a_history_that_goes_on_and_rechecks_one_that_does_not() -> None:
    from service.agent.messages import NameCheck, for_model

    user = {"role": "user", "content": [{"text": "hi"}]}
    good = {"role": "assistant", "content": [{"toolUse": {"toolUseId": "1", "name": "ok"}}]}
    bad = {"role": "assistant", "content": [{"toolUse": {"toolUseId": "2", "name": "no good"}}]}
    check = NameCheck()
    history: list[dict[str, Any]] = [user, good]
    assert check.misnamed(history) == {}
    assert for_model(history, check.misnamed(history)) is history

    history.append(bad)
    assert list(check.misnamed(history).values()) == [bad]
    assert names(for_model(history, check.misnamed(history))[2]) == ["INVALID_TOOL_NAME"]

    # The last message checked replaced (a join): checked again, the new one included.
    joined = {"role": "assistant", "content": [*bad["content"], *good["content"]]}
    history[-1] = joined
    assert list(check.misnamed(history).values()) == [joined]

    # Another history (another first message, or shorter): checked from its start.
    other = [dict(user), good]
    assert check.misnamed(other) == {}
    assert check.misnamed([bad]) == {id(bad): bad}


def test_blank_assistant_text_is_sent_as_the_reference_sends_it() -> None:
    from service.agent.messages import NameCheck, for_model

    use = {"toolUse": {"toolUseId": "t", "name": "echo", "input": {}}}
    user = {"role": "user", "content": [{"text": " "}]}
    beside = {"role": "assistant", "content": [{"text": " \n"}, use]}
    alone = {"role": "assistant", "content": [{"text": ""}, {"text": "kept"}]}
    empty: dict[str, Any] = {"role": "assistant", "content": []}
    history: list[Any] = [user, beside, alone, empty]
    sent = for_model(history, NameCheck().misnamed(history))
    assert sent == [
        user,  # the user's text is the user's: sent as it is
        {"role": "assistant", "content": [use]},
        {"role": "assistant", "content": [{"text": "[blank text]"}, {"text": "kept"}]},
        {"role": "assistant", "content": [{"text": "[blank text]"}]},
    ]
    assert history == [user, beside, alone, empty]  # the history keeps what it holds
    assert for_model(history) == sent
