"""An Anthropic reply's cited text is kept as a ``citationsContent`` block with Converse
citations, as Strands' Anthropic model and stream keep it, and goes back to Anthropic as text."""

from __future__ import annotations

import logging
from typing import Any

import anthropic_wire as wire
import pytest
from conftest import collect, make_request
from test_anthropic import provider
from wire_server import WireServer

from service.agent import context as ctx
from service.providers.anthropic_citations import converse_citation

CHAR = {
    "type": "char_location",
    "cited_text": "It rains in Bergen.",
    "document_index": 0,
    "document_title": "Handbook",
    "start_char_index": 3,
    "end_char_index": 22,
}
PAGE = {
    "type": "page_location",
    "cited_text": "Oslo is cold.",
    "document_index": 1,
    "document_title": "Atlas",
    "start_page_number": 4,
    "end_page_number": 5,
}
CHUNK = {
    "type": "content_block_location",
    "cited_text": "Fog in Stavanger.",
    "document_index": 2,
    "start_block_index": 1,
    "end_block_index": 2,
}
SEARCH = {
    "type": "search_result_location",
    "cited_text": "Sun in Tromso.",
    "search_result_index": 0,
    "source": "kb://weather",
    "title": "KB",
    "start_block_index": 0,
    "end_block_index": 1,
}
WEB = {
    "type": "web_search_result_location",
    "cited_text": "Wind in Bodo.",
    "encrypted_index": "Eo8BCioIAhgBIiQ",
    "title": "Bodo weather",
    "url": "https://Weather.Example.com/bodo?x=1",
}


def cited_block(index: int, citations: list[dict[str, Any]], *pieces: str) -> list[bytes]:
    """A text block as the API streams one with citations: each citation before its text."""
    start = {"type": "text", "text": "", "citations": []}
    return [
        wire.ev("content_block_start", index=index, content_block=start),
        *(
            wire.ev(
                "content_block_delta",
                index=index,
                delta={"type": "citations_delta", "citation": citation},
            )
            for citation in citations
        ),
        *(
            wire.ev("content_block_delta", index=index, delta={"type": "text_delta", "text": p})
            for p in pieces
        ),
        wire.ev("content_block_stop", index=index),
    ]


def cited_reply() -> list[bytes]:
    return [
        wire.message_start(),
        *wire.text_block(0, "Look: "),
        *cited_block(1, [CHAR, PAGE], "Bergen is rainy", ", Oslo cold."),
        *cited_block(2, [CHUNK, SEARCH, WEB], "Fog, sun and wind."),
        *wire.finish("end_turn"),
    ]


EXPECTED_CONTENT = [
    {"text": "Look: "},
    {
        "citationsContent": {
            "citations": [
                {
                    "title": "Handbook",
                    "sourceContent": [{"text": "It rains in Bergen."}],
                    "location": {"documentChar": {"documentIndex": 0, "start": 3, "end": 22}},
                },
                {
                    "title": "Atlas",
                    "sourceContent": [{"text": "Oslo is cold."}],
                    "location": {"documentPage": {"documentIndex": 1, "start": 4, "end": 5}},
                },
            ],
            "content": [{"text": "Bergen is rainy, Oslo cold."}],
        }
    },
    {
        "citationsContent": {
            "citations": [
                {
                    "sourceContent": [{"text": "Fog in Stavanger."}],
                    "location": {"documentChunk": {"documentIndex": 2, "start": 1, "end": 2}},
                },
                {
                    "title": "KB",
                    "sourceContent": [{"text": "Sun in Tromso."}],
                    "location": {
                        "searchResultLocation": {"searchResultIndex": 0, "start": 0, "end": 1}
                    },
                },
                {
                    "title": "Bodo weather",
                    "sourceContent": [{"text": "Wind in Bodo."}],
                    "location": {
                        "web": {
                            "url": "https://Weather.Example.com/bodo?x=1",
                            "domain": "weather.example.com",
                        }
                    },
                },
            ],
            "content": [{"text": "Fog, sun and wind."}],
        }
    },
]


async def test_cited_text_is_kept_as_citations_content_with_converse_citations(
    server: WireServer,
) -> None:
    """Before, the citation deltas were dropped and the text kept as plain text."""
    server.script(wire.stream(cited_reply()))
    deltas, reply = await collect(provider(server), make_request())
    assert deltas == ["Look: ", "Bergen is rainy", ", Oslo cold.", "Fog, sun and wind."]
    assert reply.message["content"] == EXPECTED_CONTENT
    assert reply.stop_reason == "end_turn"


async def test_citations_of_a_block_without_text_are_dropped(server: WireServer) -> None:
    """Strands hands them on to the reply's next text block, which they do not cite."""
    events = [
        wire.message_start(),
        *cited_block(0, [CHAR]),
        *wire.text_block(1, "Bergen is rainy."),
        *wire.finish("end_turn"),
    ]
    server.script(wire.stream(events))
    _, reply = await collect(provider(server), make_request())
    assert reply.message["content"] == [{"text": "Bergen is rainy."}]


async def test_cited_text_goes_back_as_text_without_its_citations(server: WireServer) -> None:
    """As Strands' format_request sends it; before, an assistant's citationsContent was left
    out of the request and a user's refused."""
    server.script(wire.stream(wire.text_events("ok")))
    quoted = {"citations": [], "content": [{"text": "as you said, "}, {"text": "rain."}]}
    history = [
        {"role": "user", "content": [{"text": "Weather?"}]},
        {"role": "assistant", "content": EXPECTED_CONTENT},
        {"role": "user", "content": [{"citationsContent": quoted}, {"text": "Thanks"}]},
    ]
    await collect(provider(server), make_request(messages=history))
    [seen] = server.requests
    assert seen.body["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Look: "},
                {"type": "text", "text": "Bergen is rainy, Oslo cold."},
                {"type": "text", "text": "Fog, sun and wind."},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "as you said, rain."},
                {"type": "text", "text": "Thanks"},
            ],
        },
    ]


async def test_an_anthropic_summarizer_s_cited_text_is_summary_text(server: WireServer) -> None:
    """The summary written through the Anthropic provider keeps its cited text (the context
    code reads citationsContent as text since the Bedrock fix)."""
    server.script(wire.stream(cited_reply()))
    request = [{"role": "user", "content": [{"text": ctx.SUMMARY_REQUEST}]}]
    blocks, _ = await ctx.write_summary(provider(server), None, request, make_request())
    assert blocks == [
        {"text": "Look: "},
        {"text": "Bergen is rainy, Oslo cold."},
        {"text": "Fog, sun and wind."},
    ]


def test_a_citation_of_an_unknown_kind_keeps_its_title_and_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    raw = {"type": "map_location", "cited_text": "Here.", "title": "Map", "x": 1}
    with caplog.at_level(logging.WARNING):
        assert converse_citation(raw) == {"title": "Map", "sourceContent": [{"text": "Here."}]}
    assert "map_location" in caplog.text
