"""Context management: what the model receives of a long session, under each strategy.

The scripted model records every request; each is checked against the rules a provider
enforces (a user message first, roles alternating, every toolUse answered in the next message
and no toolResult without its toolUse) and against the window. The history itself keeps every
message.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from engine_helpers import add, check_history, invoke, resume

from service.agent import context as ctx
from service.agent.context import ContextPolicy, ContextState, build_view
from service.agent.definition import AgentDefinition
from service.agent.errors import ContextOverflowError, ModelError
from service.agent.provider import ModelRequest
from service.agent.state import SessionState
from service.agent.types import Message
from service.providers.scripted import ScriptedModel, ScriptedReply, ToolCall
from service.sessions.codec import decode_state, encode_state
from service.sessions.delivery import Delivery
from service.sessions.store import SessionStore
from tests.support.session_records import writer_for

CYCLES = 300
PROMPT = "Add up the numbers, one tool call at a time."


def _results(message: Message) -> list[str]:
    return [b["toolResult"]["toolUseId"] for b in message["content"] if "toolResult" in b]


def _uses(message: Message) -> list[str]:
    return [b["toolUse"]["toolUseId"] for b in message["content"] if "toolUse" in b]


def check_request(messages: list[Message]) -> None:
    """What every provider accepts: user first, roles alternating, each toolUse answered in
    the next message, no toolResult whose toolUse is not just before it."""
    assert messages, "an empty request"
    assert messages[0]["role"] == "user", "the request opens on an assistant message"
    for before, after in itertools.pairwise(messages):
        assert before["role"] != after["role"], f"two {before['role']} messages in a row"
    for index, message in enumerate(messages):
        results = _results(message)
        if results:
            assert index > 0, "the request opens on a toolResult"
            assert results == _uses(messages[index - 1]), "a toolResult without its toolUse"
        uses = _uses(message)
        if uses and index + 1 < len(messages):
            assert _results(messages[index + 1]) == uses, "a toolUse without its result"


def is_summary_request(request: ModelRequest) -> bool:
    return request.system_prompt in (ctx.SUMMARY_PROMPT, "You write summaries.")


def summary_of(request: ModelRequest) -> str:
    """A summary that depends only on what it summarizes (the same on every instance)."""
    ids = [i for m in request.messages for i in _results(m)]
    return f"Summary: tool results {ids[0]}..{ids[-1]} added up." if ids else "Summary: nothing."


def long_run(request: ModelRequest, _index: int) -> ScriptedReply | str:
    """Tool call t0, t1, ... until ``CYCLES`` of them, then the answer; decided from the
    request alone, so any instance replies the same."""
    if is_summary_request(request):
        return summary_of(request)
    done = _results(request.messages[-1])
    n = int(done[-1][1:]) + 1 if done else 0
    if n == CYCLES:
        return "The total is ready."
    return ScriptedReply(tool_calls=(ToolCall("add", {"a": n, "b": 1}, f"t{n}"),))


def agent_with(
    policy: ContextPolicy, *, window: int | None = None, checkpointing: bool = False
) -> AgentDefinition:
    return AgentDefinition(
        name="counter",
        model=ScriptedModel(long_run, record=True, context_window=window),
        system_prompt="You count.",
        tools=[add],
        checkpointing=checkpointing,
        context=policy,
    )


def requests_of(agent: AgentDefinition) -> list[ModelRequest]:
    model = agent.model
    assert isinstance(model, ScriptedModel)
    return [r for r in model.requests if not is_summary_request(r)]


SUMMARIZER = AgentDefinition(
    name="notes",
    model=ScriptedModel(long_run, record=True),
    system_prompt="You write summaries.",
)
POLICIES = {
    "sliding_window": ContextPolicy(),
    "sliding_window_small": ContextPolicy(max_messages=7),
    "summarize_own_model": ContextPolicy("summarize", max_messages=30, keep_recent=8),
    "summarize_by_agent": ContextPolicy("summarize", summarizer=SUMMARIZER),
    "none": ContextPolicy("none"),
}


@pytest.mark.parametrize("name", list(POLICIES))
async def test_a_300_cycle_session_runs_to_the_end_within_the_window(name: str) -> None:
    policy = POLICIES[name]
    agent = agent_with(policy)
    out = await invoke(agent, SessionState(session_id=f"long-{name}"), PROMPT)

    assert out.stop == "end_turn"
    assert out.result.message == {"role": "assistant", "content": [{"text": "The total is ready."}]}
    # storage keeps the whole history: the prompt, 300 tool cycles, the answer
    assert len(out.state.messages) == 2 + 2 * CYCLES
    check_history(out.state)
    requests = requests_of(agent)
    assert len(requests) == CYCLES + 1
    for request in requests:
        check_request(request.messages)
        if policy.strategy != "none":
            assert len(request.messages) <= policy.max_messages
    if policy.strategy == "none":
        assert [len(r.messages) for r in requests] == [1 + 2 * n for n in range(CYCLES + 1)]
        assert out.state.context is None
        return
    last = requests[-1].messages
    assert last[-1] == out.state.messages[-2], "the view ends where the history ends"
    assert out.state.context is not None
    assert decode_state(encode_state(out.state)).context == out.state.context
    if policy.strategy == "sliding_window":
        # a view inside the long run of tool cycles opens with the request being worked on
        assert last[0]["content"] == [{"text": PROMPT}]
        assert len(last) >= policy.max_messages - 1, "the window is full, not needlessly short"
        assert out.state.context.summary is None
    else:
        summary = out.state.context.summary
        assert summary is not None and summary[0]["text"].startswith("Summary: tool results")
        assert last[0]["content"][: len(summary)] == summary


async def test_the_summarizer_agent_writes_the_summaries_with_its_own_prompt() -> None:
    model = SUMMARIZER.model
    assert isinstance(model, ScriptedModel)
    before = len(model.requests)
    agent = agent_with(POLICIES["summarize_by_agent"])
    out = await invoke(agent, SessionState(session_id="by-agent"), PROMPT)
    assert out.stop == "end_turn"
    asked = model.requests[before:]
    assert asked, "the summarizer agent was never asked"
    for request in asked:
        assert request.system_prompt == "You write summaries."
        check_request(request.messages)
        assert request.messages[-1]["content"][-1] == {"text": ctx.SUMMARY_REQUEST}
    own = agent.model
    assert isinstance(own, ScriptedModel)
    assert not [r for r in own.requests if is_summary_request(r)]


class Changelog:
    """The sessions changelog as the records of each write, read back as a new owner reads
    it (the head and history records decoded, nothing cached)."""

    def __init__(self) -> None:
        self.writer = writer_for()
        self.reader = SessionStore()

    def restore_elsewhere(self, state: SessionState) -> SessionState:
        for key, value in self.writer.write(state, 0, Delivery(())).records:
            self.reader.load(key, value, [])
        loaded = self.reader.get(state.session_id)
        assert loaded is not None
        return loaded.state


def sent_to(agent: AgentDefinition) -> list[list[Message]]:
    model = agent.model
    assert isinstance(model, ScriptedModel)
    return [r.messages for r in model.requests]


@pytest.mark.parametrize("name", ["sliding_window_small", "summarize_own_model"])
async def test_resumes_on_other_instances_send_the_same_context(name: str) -> None:
    """Each pause goes through the changelog's records to a new instance with a new model:
    the model receives exactly what one uninterrupted run sends it, summaries included."""
    policy = POLICIES[name]
    straight = agent_with(policy)
    out = await invoke(straight, SessionState(session_id="same"), PROMPT)
    assert out.stop == "end_turn"
    expected = sent_to(straight)

    sent: list[list[Message]] = []
    changelog = Changelog()
    state = SessionState(session_id="same")
    step: Any = PROMPT
    for _ in range(2 * CYCLES + 1):
        instance = agent_with(policy, checkpointing=True)
        out = await invoke(instance, state, step)
        sent.extend(sent_to(instance))
        state = changelog.restore_elsewhere(out.state)
        if out.stop != "checkpoint":
            break
        step = resume(out)
    assert out.stop == "end_turn"
    assert len(sent) == len(expected)
    assert sent == expected
    assert state.context is not None and state.context.start > 0
    if policy.strategy == "summarize":
        assert state.context.summary is not None


async def test_overflow_reduces_the_window_and_retries_the_same_call() -> None:
    # The model takes at most 9 messages, the window 40: each overflow halves the view.
    agent = agent_with(ContextPolicy(), window=9)
    out = await invoke(agent, SessionState(session_id="overflow"), PROMPT)
    assert out.stop == "end_turn"
    requests = requests_of(agent)
    served = [r for r in requests if len(r.messages) <= 9]
    assert len(served) == CYCLES + 1
    for request in served:
        check_request(request.messages)
    refused = [n for n, r in enumerate(requests) if len(r.messages) > 9]
    assert refused, "no call overflowed"
    for n in refused:
        # the same call again, at once, on a smaller view ending with the same message
        retry = requests[n + 1].messages
        assert len(retry) <= 9
        assert retry[-1] == requests[n].messages[-1]
    # one reduction is enough each time: the view halves, then grows again call by call
    assert len(refused) <= len(served) // 2
    assert out.result.metrics["invocation"]["cycles"] == CYCLES + 1


async def test_overflow_that_cannot_be_reduced_ends_context_overflow_and_stays_resumable() -> None:
    # Two tool cycles fit; the third request holds the prompt, a toolUse and its results,
    # which no window can cut below three messages.
    agent = agent_with(ContextPolicy(max_messages=3), window=2, checkpointing=True)
    state = SessionState(session_id="stuck")
    out = await invoke(agent, state, PROMPT)
    assert out.stop == "checkpoint"
    out = await invoke(agent, out.state, resume(out))
    assert out.checkpoint == {"position": "after_tools", "cycle_index": 0, "schema_version": "1.0"}
    paused = out
    out = await invoke(agent, paused.state, resume(paused))
    assert out.stop == "error"
    assert out.result.error is not None
    assert out.result.error.code == "context_overflow"
    assert "cannot be reduced further" in out.result.error.message
    # the pause is still valid: the same resume goes on once the model takes the context
    state = decode_state(encode_state(out.state))
    assert state.checkpoint == paused.state.checkpoint
    bigger = agent_with(ContextPolicy(max_messages=3), window=3, checkpointing=True)
    out = await invoke(bigger, state, resume(paused))
    assert out.stop == "checkpoint"
    assert out.checkpoint == {"position": "after_model", "cycle_index": 1, "schema_version": "1.0"}


async def test_a_summary_too_long_for_the_summarizer_is_written_from_fewer_messages() -> None:
    notes = AgentDefinition(
        name="small-notes",
        model=ScriptedModel(long_run, record=True, context_window=20),
        system_prompt="You write summaries.",
    )
    agent = agent_with(ContextPolicy("summarize", max_messages=30, keep_recent=8, summarizer=notes))
    out = await invoke(agent, SessionState(session_id="small-notes"), PROMPT)
    assert out.stop == "end_turn"
    requests = requests_of(agent)
    assert len(requests) == CYCLES + 1
    for request in requests:
        check_request(request.messages)
        assert len(request.messages) <= 30
    model = notes.model
    assert isinstance(model, ScriptedModel)
    asked = [len(r.messages) for r in model.requests]
    assert any(n > 20 for n in asked), "no summary request overflowed"
    assert any(n <= 20 for n in asked)
    # the refused summaries are not model calls of the agent: every cycle is counted once
    assert out.result.metrics["invocation"]["cycles"] == CYCLES + 1


async def test_a_failed_summary_ends_model_error_and_changes_no_view() -> None:
    broken = AgentDefinition(
        name="broken-notes", model=ScriptedModel([ModelError("summarizer down")])
    )
    agent = agent_with(ContextPolicy("summarize", max_messages=5, keep_recent=2, summarizer=broken))
    out = await invoke(agent, SessionState(session_id="broken"), PROMPT)
    assert out.stop == "error"
    assert out.result.error is not None and out.result.error.code == "model_error"
    assert out.state.context is None
    assert len(out.state.messages) == 7, "the history is kept"


async def test_strategy_none_does_not_reduce_on_overflow() -> None:
    agent = agent_with(ContextPolicy("none"), window=4)
    out = await invoke(agent, SessionState(session_id="none"), PROMPT)
    assert out.stop == "error"
    assert out.result.error is not None and out.result.error.code == "context_overflow"
    assert len(out.state.messages) == 5, "the history is kept as it was"
    assert out.state.context is None


def _tool_cycle(n: int) -> list[Message]:
    return [
        {
            "role": "assistant",
            "content": [{"toolUse": {"toolUseId": f"u{n}", "name": "add", "input": {}}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": f"u{n}",
                        "status": "success",
                        "content": [{"text": "1"}],
                    }
                }
            ],
        },
    ]


HISTORY: list[Message] = [
    {"role": "user", "content": [{"text": "first"}]},
    {"role": "assistant", "content": [{"text": "ok"}]},
    {"role": "user", "content": [{"text": "second"}, {"image": {"format": "png"}}]},
    *_tool_cycle(0),
    *_tool_cycle(1),
]


def test_views_never_open_on_a_tool_result_and_keep_the_request() -> None:
    assert [ctx.can_start(HISTORY, i) for i in range(len(HISTORY))] == [
        True, True, True, True, False, True, False,
    ]  # fmt: skip
    # a view opening on an assistant message is preceded by the request it works on
    view = build_view(HISTORY, ContextState(5))
    assert view[0] == {
        "role": "user",
        "content": [{"text": "second"}, {"image": {"format": "png"}}],
    }
    assert view[1:] == HISTORY[5:]
    # a summary opens the view; joined to a user message, so roles still alternate
    summary = [{"text": "earlier: greeting"}]
    assert build_view(HISTORY, ContextState(2, summary))[0] == {
        "role": "user",
        "content": [*summary, *HISTORY[2]["content"]],
    }
    assert build_view(HISTORY, ContextState(3, summary))[0] == {"role": "user", "content": summary}
    assert build_view(HISTORY, None) == HISTORY


def test_a_reduction_halves_the_view_and_stops_when_nothing_is_left() -> None:
    assert ctx.smaller_start(HISTORY, ContextState()) == 5  # 7 messages -> 3 (request + 2)
    assert ctx.smaller_start(HISTORY, ContextState(2)) == 5  # 5 -> 3: none of 2 exists
    assert ctx.smaller_start(HISTORY, ContextState(5)) is None  # request, toolUse, result


def test_a_summary_keeps_the_most_recent_messages() -> None:
    assert ctx.summary_start(HISTORY, ContextState(), keep=4) == 3
    assert ctx.summary_start(HISTORY, ContextState(), keep=3) == 3  # never on a toolResult
    asked = ctx.summary_request(HISTORY, ContextState(), 5)
    assert asked[-1] == {
        "role": "user",
        "content": [*HISTORY[4]["content"], {"text": ctx.SUMMARY_REQUEST}],
    }


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"strategy": "window"}, "context strategy must be one of"),
        ({"max_messages": 2}, "at least 3"),
        ({"max_messages": True}, "must be an integer"),
        ({"strategy": "summarize", "keep_recent": 39}, "between 1 and max_messages - 2"),
        ({"summarizer": SUMMARIZER}, "needs strategy 'summarize'"),
    ],
)
def test_bad_policies_are_refused(kwargs: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        ContextPolicy(**kwargs)


def test_the_default_is_the_reference_window_of_40() -> None:
    agent = AgentDefinition(name="d", model=ScriptedModel([]))
    assert agent.context == ContextPolicy("sliding_window", 40)


def test_a_state_without_a_view_keeps_the_earlier_layout() -> None:
    state = SessionState(session_id="plain")
    assert "context" not in state.to_dict()
    state.context = ContextState(4, [{"text": "s"}])
    assert state.to_dict()["context"] == {"start": 4, "summary": [{"text": "s"}]}
    assert SessionState.from_dict(state.to_dict()) == state
    with pytest.raises(ValueError, match="non-negative"):
        ContextState.from_dict({"start": -1})


def test_an_overflow_error_is_a_model_error_with_its_own_code() -> None:
    error = ContextOverflowError("too long")
    assert error.code == "context_overflow"


def test_a_view_starting_past_the_history_sends_the_whole_history() -> None:
    beyond = ContextState(len(HISTORY) + 3)
    assert build_view(HISTORY, beyond) == HISTORY
    assert ctx.view_size(HISTORY, beyond.start, False) == len(HISTORY)
    assert ctx.smaller_start(HISTORY, beyond) is None


def test_a_window_opens_on_a_request_so_it_may_send_one_message_less() -> None:
    """As docs/from-strands.md says: a window of N sends N - 1 messages when the cut falls on an
    assistant message; inside tool cycles the request is sent again where the reference's
    window opens on the assistant's toolUse."""
    chat: list[Message] = [
        {"role": role, "content": [{"text": str(n)}]}
        for n, role in enumerate(["user", "assistant"] * 2 + ["user"])
    ]
    start = ctx.window_start(chat, ContextState(), 4, False)
    assert start == 2 and len(build_view(chat, ContextState(start))) == 3
    start = ctx.window_start(HISTORY, ContextState(), 4, False)
    assert start == 5
    assert build_view(HISTORY, ContextState(start)) == [
        {"role": "user", "content": HISTORY[2]["content"]},
        *HISTORY[5:],
    ]


def test_cited_text_of_a_summarizer_reply_is_summary_text() -> None:
    """A Bedrock summarizer's cited text is a citationsContent block (as Strands keeps it); its
    text is the summary, so such a reply is not taken for one that wrote no text."""
    reply: Message = {
        "role": "assistant",
        "content": [
            {"text": "So far: "},
            {
                "citationsContent": {
                    "citations": [{"title": "notes", "sourceContent": [{"text": "n"}]}],
                    "content": [{"text": "the user asked for rain data."}],
                }
            },
            {"reasoningContent": {"reasoningText": {"text": "not summary"}}},
        ],
    }
    assert ctx.summary_blocks(reply) == [
        {"text": "So far: "},
        {"text": "the user asked for rain data."},
    ]


@pytest.mark.parametrize("name", ["sliding_window_small", "summarize_own_model"])
async def test_the_scripted_models_own_tool_ids_stay_unique_past_the_window(name: str) -> None:
    """A scripted model's default toolUseIds count the whole conversation, not the view the
    policy shows it: past the window they would otherwise come again, and a once tool's
    idempotency key (session and toolUseId) would take a new call for an old one."""

    calls = itertools.count()

    def default_ids(request: ModelRequest, _index: int) -> ScriptedReply | str:
        if is_summary_request(request):
            return summary_of(request)
        cycle = next(calls)
        if cycle == 40:
            return "The total is ready."
        return ScriptedReply(tool_calls=(ToolCall("add", {"a": cycle, "b": 1}),))

    agent = AgentDefinition(
        name="counter",
        model=ScriptedModel(default_ids),
        system_prompt="You count.",
        tools=[add],
        context=POLICIES[name],
    )
    out = await invoke(agent, SessionState(session_id=f"ids-{name}"), PROMPT)
    assert out.stop == "end_turn"
    ids = [i for m in out.state.messages for i in _uses(m)]
    assert len(ids) == 40
    assert len(set(ids)) == 40, sorted(ids)
