"""A tool result's JSON goes to Amazon Nova models on Bedrock as text, as Strands' BedrockModel
sends it (Nova misreads JSON blocks), and to every other model as JSON."""

from __future__ import annotations

import pytest
from conftest import JSON_RESULT as VALUE
from conftest import JSON_RESULT_HISTORY as HISTORY
from conftest import make_request

from service.providers.bedrock import BedrockProvider
from service.providers.config import BedrockConfig

AS_TEXT = '{"city": "Z\\u00fcrich", "temps": [1, 2.5], "ok": true, "note": null}'
"""Python's default JSON text of VALUE, written out by hand: Strands sends ``json.dumps``."""


@pytest.mark.parametrize(
    ("model_id", "as_text"),
    [
        ("amazon.nova-pro-v1:0", True),
        ("us.amazon.nova-lite-v1:0", True),
        ("amazon.nova-premier-v1:0", True),
        ("anthropic.claude-3-5-haiku-20241022-v1:0", False),
        ("meta.llama3-1-70b-instruct-v1:0", False),
        ("amazon.titan-text-premier-v1:0", False),
    ],
)
def test_json_results_go_as_text_to_nova_models(model_id: str, as_text: bool) -> None:
    """Before, every model was sent the json blocks."""
    prov = BedrockProvider(BedrockConfig(model_id=model_id, region="us-east-1"))
    params = prov.request_params(make_request(messages=HISTORY))
    [sent] = params["messages"][2]["content"]
    expected = (
        [{"text": "found:"}, {"text": AS_TEXT}, {"text": '[3, "x"]'}]
        if as_text
        else [{"text": "found:"}, {"json": VALUE}, {"json": [3, "x"]}]
    )
    assert sent["toolResult"]["content"] == expected
