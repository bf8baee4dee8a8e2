"""A zero-latency scripted model for the reference SDK; runs only inside the scratch virtualenv.

Picks its reply from the conversation itself (see ``scenario.reply_index``), so a freshly
restored agent gets the same reply as one kept in memory; fails loudly when the script runs out.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterable
from typing import Any

import scenario
from strands.models.model import Model


def reply_events(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """One reply as the Bedrock-shaped stream events the SDK's stream processor consumes."""
    events: list[dict[str, Any]] = [{"messageStart": {"role": "assistant"}}]
    if "tool_use" in reply:
        use = reply["tool_use"]
        events += [
            {
                "contentBlockStart": {
                    "start": {"toolUse": {"toolUseId": use["toolUseId"], "name": use["name"]}}
                }
            },
            {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(use["input"])}}}},
            {"contentBlockStop": {}},
            {"messageStop": {"stopReason": "tool_use"}},
        ]
    else:
        events += [
            {"contentBlockStart": {"start": {}}},
            {"contentBlockDelta": {"delta": {"text": reply["text"]}}},
            {"contentBlockStop": {}},
            {"messageStop": {"stopReason": "end_turn"}},
        ]
    events.append(
        {
            "metadata": {
                "usage": {"inputTokens": 10, "outputTokens": 5, "totalTokens": 15},
                "metrics": {"latencyMs": 0},
            }
        }
    )
    return events


SCRIPT = tuple(reply_events(reply) for reply in scenario.REPLIES)
"""Built once: the SDK builds its messages from these events without mutating them."""


class ScriptedReferenceModel(Model):
    """Replays ``scenario.REPLIES`` with no latency."""

    def __init__(self) -> None:
        self._config: dict[str, Any] = {"model_id": "scripted", "context_window_limit": 200_000}

    def update_config(self, **model_config: Any) -> None:
        self._config.update(model_config)

    def get_config(self) -> Any:
        return self._config

    def structured_output(self, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
        raise NotImplementedError("the benchmark never asks for structured output")

    async def stream(
        self, messages: Any, tool_specs: Any = None, system_prompt: Any = None, **kwargs: Any
    ) -> AsyncIterable[Any]:
        index = scenario.reply_index(messages)
        if index >= len(SCRIPT):
            raise RuntimeError(f"scripted model ran out of replies at index {index}")
        for event in SCRIPT[index]:
            yield event
