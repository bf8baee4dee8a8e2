"""What the demo agent's scripted model says, decided from the conversation alone.

A prompt mentioning a slow job (``"slow"`` or ``"job"``) runs the cancellable job;
any other prompt runs the tour: a calculation and a forecast (one tool batch), an approval
(an interrupt), then an answer built from the tool results in the conversation. Being a
function of the conversation only, one model serves every session and a replay says the same.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import orjson

from service.agent.provider import ModelRequest
from service.agent.types import Message
from service.providers.scripted import ReplySpec, ScriptedReply, ToolCall

_EXPRESSION = re.compile(r"[-+(]*\d[\d.\s()+\-*/%]*[+\-*/%][\d.\s()+\-*/%]*\d\)*")
_CITY = re.compile(r"\b(?:in|for|at)\s+([A-Z][a-zA-Z\-]+(?:\s[A-Z][a-zA-Z\-]+)?)")
_SECONDS = re.compile(r"(\d+(?:\.\d+)?)\s*(?:s\b|sec|second)")
_SLOW_WORDS = ("slow", "job")
DEFAULT_EXPRESSION = "17 * 23"
DEFAULT_CITY = "Lisbon"
DEFAULT_JOB_SECONDS = 30.0
# Streaming the final answer in pieces shows text events and leaves room for a cancel.
_CHUNK_LATENCY_S = 0.05


def _prompt(messages: Sequence[Message]) -> str:
    """The text of the user message that opened the current turn."""
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        texts = [str(block["text"]) for block in message.get("content", ()) if "text" in block]
        if texts:
            return " ".join(texts)
    return ""


def _tool_outputs(messages: Sequence[Message]) -> dict[str, Any]:
    """Tool name -> its latest result in the conversation (text, or the JSON value)."""
    names: dict[str, str] = {}
    outputs: dict[str, Any] = {}
    for message in messages:
        for block in message.get("content", ()):
            if "toolUse" in block:
                names[block["toolUse"]["toolUseId"]] = block["toolUse"]["name"]
            elif "toolResult" in block:
                result = block["toolResult"]
                name = names.get(result.get("toolUseId", ""), "?")
                for part in result.get("content") or []:
                    if "json" in part:
                        outputs[name] = part["json"]
                    elif "text" in part:
                        outputs[name] = _maybe_json(str(part["text"]))
    return outputs


def _maybe_json(text: str) -> Any:
    """A JSON object written as text (how some providers carry tool values), else the text."""
    if not text.startswith("{"):
        return text
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _forecast(value: Any) -> str:
    if isinstance(value, dict) and "conditions" in value:
        return f"{value.get('conditions')}, {value.get('temperature_c')} °C in {value.get('city')}"
    return str(value) if value is not None else "n/a"


def _approved(value: Any) -> bool:
    return isinstance(value, dict) and value.get("approved") is True


def _chunks(text: str, size: int = 24) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _answer(text: str) -> ScriptedReply:
    return ScriptedReply(text=text, chunks=_chunks(text), chunk_latency=_CHUNK_LATENCY_S)


def _job_reply(prompt: str, index: int, messages: Sequence[Message]) -> ReplySpec:
    if index == 0:
        found = _SECONDS.search(prompt)
        seconds = float(found.group(1)) if found else DEFAULT_JOB_SECONDS
        return ScriptedReply(
            text=f"Starting the job ({seconds:g}s); cancel me whenever you like.",
            tool_calls=(ToolCall("slow_job", {"seconds": seconds}),),
        )
    outcome = _tool_outputs(messages).get("slow_job", "no result")
    return _answer(f"The job is over: {outcome}.")


def _tour_reply(prompt: str, index: int, messages: Sequence[Message]) -> ReplySpec:
    if index == 0:
        expression = _EXPRESSION.search(prompt)
        city = _CITY.search(prompt)
        return ScriptedReply(
            text="Let me calculate that and look at the forecast.",
            tool_calls=(
                ToolCall(
                    "calculator",
                    {
                        "expression": expression.group(0).strip()
                        if expression
                        else DEFAULT_EXPRESSION
                    },
                ),
                ToolCall("weather", {"city": city.group(1) if city else DEFAULT_CITY}),
            ),
        )
    if index == 1:
        return ScriptedReply(
            text="Before I share this with your team, I need your approval.",
            tool_calls=(
                ToolCall("request_approval", {"action": "share the summary with the team"}),
            ),
        )
    outputs = _tool_outputs(messages)
    shared = _approved(outputs.get("request_approval"))
    verdict = "shared it with the team" if shared else "kept it to myself (not approved)"
    return _answer(
        f"Result: {outputs.get('calculator', 'n/a')}. "
        f"Forecast: {_forecast(outputs.get('weather'))}. I {verdict}."
    )


def demo_reply(request: ModelRequest, index: int) -> ReplySpec:
    """The responder of the demo's scripted model (see the module docstring)."""
    prompt = _prompt(request.messages)
    lowered = prompt.lower()
    if any(word in lowered for word in _SLOW_WORDS):
        return _job_reply(prompt, index, request.messages)
    return _tour_reply(prompt, index, request.messages)


def describe() -> dict[str, Any]:
    """What to type to see each part of the demo (printed by ``make run``)."""
    return {
        "tour": "What is 17 * 23, and the weather in Lisbon?",
        "slow job": "Run the slow job for 60 seconds",
    }
