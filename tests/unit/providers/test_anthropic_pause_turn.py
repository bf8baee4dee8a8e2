"""A turn Anthropic pauses (``pause_turn``) is resumed within the same model call, as in the
reference: the paused content is sent back as it is, at most 10 times."""

from __future__ import annotations

import anthropic_wire as wire
import pytest
from conftest import collect, make_request
from test_anthropic import provider
from wire_server import WireServer

from service.agent.errors import ModelError

MAX_PAUSE_TURN_CONTINUATIONS = 10
"""The reference's bound (strands ``_MAX_PAUSE_TURN_CONTINUATIONS``)."""

QUERY = {"query": "weather Paris"}
SEARCH_RESULT = {
    "type": "web_search_tool_result",
    "tool_use_id": "srvtoolu_01",
    "content": [
        {
            "type": "web_search_result",
            "title": "Paris weather",
            "url": "https://example.com/paris",
            "encrypted_content": "EqgfCioIARgBIiQ3",
        }
    ],
}


def paused_search() -> list[bytes]:
    """A call that searched server-side and paused before answering."""
    start = 0
    return [
        wire.message_start(),
        *wire.text_block(start, "Searching."),
        wire.ev(
            "content_block_start",
            index=start + 1,
            content_block={"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search"},
        ),
        wire.ev(
            "content_block_delta",
            index=start + 1,
            delta={"type": "input_json_delta", "partial_json": '{"query": '},
        ),
        wire.ev(
            "content_block_delta",
            index=start + 1,
            delta={"type": "input_json_delta", "partial_json": '"weather Paris"}'},
        ),
        wire.ev("content_block_stop", index=start + 1),
        wire.ev("content_block_start", index=start + 2, content_block=SEARCH_RESULT),
        wire.ev("content_block_stop", index=start + 2),
        *wire.finish("pause_turn", 7),
    ]


async def test_paused_turn_is_resumed_with_the_paused_content(server: WireServer) -> None:
    resumed = [wire.message_start(40), *wire.text_block(0, "Sunny."), *wire.finish("end_turn", 5)]
    server.script(wire.stream(paused_search()), wire.stream(resumed))
    deltas, reply = await collect(provider(server), make_request())

    assert deltas == ["Searching.", "Sunny."]
    assert reply.stop_reason == "end_turn"
    # Server-side tool blocks are not ours to keep (as the reference filters them out).
    assert reply.message["content"] == [{"text": "Searching."}, {"text": "Sunny."}]
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (65, 12)
    first, second = server.requests
    assert second.body["messages"] == [
        *first.body["messages"],
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Searching."},
                {
                    "type": "server_tool_use",
                    "id": "srvtoolu_01",
                    "name": "web_search",
                    "input": QUERY,
                },
                SEARCH_RESULT,
            ],
        },
    ]
    assert {k: v for k, v in second.body.items() if k != "messages"} == {
        k: v for k, v in first.body.items() if k != "messages"
    }


async def test_every_paused_call_is_appended_in_turn(server: WireServer) -> None:
    tool = wire.tool_block(0, "toolu_W", "get_weather", wire.tool_args({"city": "Paris"}))
    server.script(
        wire.stream(paused_search()),
        wire.stream(paused_search()),
        wire.stream([wire.message_start(), *tool, *wire.finish("tool_use")]),
    )
    _, reply = await collect(provider(server), make_request())

    assert reply.stop_reason == "tool_use"
    assert reply.message["content"] == [
        {"text": "Searching."},
        {"text": "Searching."},
        {"toolUse": {"toolUseId": "toolu_W", "name": "get_weather", "input": {"city": "Paris"}}},
    ]
    messages = [r.body["messages"] for r in server.requests]
    assert [len(m) for m in messages] == [1, 2, 3]
    assert messages[2][:2] == messages[1]
    assert messages[2][2] == messages[1][1]


async def test_a_turn_still_paused_after_the_bound_is_a_model_error(server: WireServer) -> None:
    server.script(*(wire.stream(paused_search()) for _ in range(MAX_PAUSE_TURN_CONTINUATIONS + 1)))
    with pytest.raises(ModelError, match="did not complete after 10 continuations"):
        await collect(provider(server), make_request())
    assert len(server.requests) == MAX_PAUSE_TURN_CONTINUATIONS + 1


async def test_a_retried_failure_of_a_resumed_call_starts_the_reply_over(
    server: WireServer,
) -> None:
    done = [wire.message_start(), *wire.text_block(0, "Sunny."), *wire.finish("end_turn")]
    server.script(
        wire.stream(paused_search()),
        wire.overloaded(),
        wire.stream(paused_search()),
        wire.stream(done),
    )
    _, reply = await collect(provider(server), make_request())

    assert reply.message["content"] == [{"text": "Searching."}, {"text": "Sunny."}]
    assert [len(r.body["messages"]) for r in server.requests] == [1, 2, 1, 2]
