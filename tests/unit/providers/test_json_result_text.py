"""A tool result's JSON goes to Anthropic and to OpenAI-compatible servers as the text Strands
1.62.0 writes in its place: ``json.dumps`` with its default separators and non-ASCII characters
kept as they are (``ensure_ascii=False``), so a model reads the same result under either."""

from __future__ import annotations

from conftest import JSON_RESULT_HISTORY as HISTORY
from conftest import make_request
from pydantic import SecretStr

from service.providers.anthropic import AnthropicProvider
from service.providers.config import AnthropicConfig, OpenAICompatConfig
from service.providers.openai_compat import OpenAICompatProvider

AS_TEXT = '{"city": "Zürich", "temps": [1, 2.5], "ok": true, "note": null}'
"""JSON_RESULT as Strands' Anthropic and OpenAI formatters write it, written out by hand."""


def test_anthropic_is_sent_json_results_as_strands_writes_them() -> None:
    """Before, the text was compact (``{"city":"Zürich",...}``)."""
    prov = AnthropicProvider(AnthropicConfig(model_id="claude-test", api_key=SecretStr("k")))
    [result] = prov.request_params(make_request(messages=HISTORY))["messages"][2]["content"]
    assert result["content"] == [
        {"type": "text", "text": "found:"},
        {"type": "text", "text": AS_TEXT},
        {"type": "text", "text": '[3, "x"]'},
    ]


def test_openai_compat_is_sent_json_results_as_strands_writes_them() -> None:
    """Before, the text was compact (``{"city":"Zürich",...}``)."""
    config = OpenAICompatConfig(model_id="gpt-test", base_url="http://127.0.0.1:9/v1")
    prov = OpenAICompatProvider(config)
    tool_message = prov.request_params(make_request(messages=HISTORY))["messages"][3]
    assert tool_message == {
        "role": "tool",
        "tool_call_id": "t1",
        "content": f'found:\n{AS_TEXT}\n[3, "x"]',
    }
