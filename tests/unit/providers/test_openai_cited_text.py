"""Cited text (a ``citationsContent`` block a Bedrock or Anthropic reply left in the history)
goes to an OpenAI-compatible server, and to an OpenAI summarizer, as its text. Strands' OpenAI
model raises ``TypeError`` on the block; Cairn carries a session across providers, so it sends
the text as its Anthropic provider does."""

from __future__ import annotations

from typing import Any

import openai_wire as wire
from conftest import collect, make_request
from test_openai_compat import provider
from wire_server import WireServer

from service.agent import context as ctx

CITED = {
    "citations": [
        {
            "title": "Forecast",
            "location": {"documentChar": {"documentIndex": 0, "start": 0, "end": 19}},
            "sourceContent": [{"text": "It rains in Bergen."}],
        }
    ],
    "content": [{"text": "Bergen is rainy, "}, {"text": "Oslo cold."}],
}

HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": [{"text": "Weather?"}]},
    {"role": "assistant", "content": [{"text": "Look: "}, {"citationsContent": CITED}]},
    {
        "role": "user",
        "content": [
            {"citationsContent": {"citations": [], "content": [{"text": "as you said"}]}},
            {"text": "Thanks"},
        ],
    },
]


async def test_cited_text_goes_to_the_server_as_text(server: WireServer) -> None:
    """Before, the assistant's cited text was left out and the user's block refused."""
    server.script(wire.stream(wire.text_events("ok")))
    await collect(provider(server), make_request(messages=HISTORY))
    [seen] = server.requests
    assert seen.body["messages"][1:] == [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Look: Bergen is rainy, Oslo cold."},
        {"role": "user", "content": "as you said\nThanks"},
    ]


async def test_an_openai_summarizer_reads_cited_text(server: WireServer) -> None:
    """The summarizer is sent the history through the same mapping: before, it refused the
    user's cited text, so no summary could be written."""
    server.script(wire.stream(wire.text_events("They talked weather.")))
    request = ctx.summary_request(HISTORY, ctx.ContextState(), len(HISTORY))
    blocks, _ = await ctx.write_summary(provider(server), None, request, make_request())
    assert blocks == [{"text": "They talked weather."}]
    sent = server.requests[0].body["messages"]
    assert sent[2] == {"role": "assistant", "content": "Look: Bergen is rainy, Oslo cold."}
    assert sent[3]["content"].startswith("as you said\nThanks\n")
