"""A stop reason the provider gives that Cairn does not know: the turn ends ``end_turn`` (the
wire's set is closed), the reply's tool calls are kept unrun, never dropped, and a warning names
the raw value; the next prompt answers the calls as for any reply that stopped otherwise."""

from __future__ import annotations

import json
import logging
from typing import Any

import anthropic_wire as aw
import openai_wire as ow
import pytest
from test_engine_over_providers import (  # the autouse fixture closes the Bedrock clients
    KINDS,
    _close_providers,  # noqa: F401
    agent,
    run,
    text_reply,
    tool_results_sent,
)
from wire_server import Reply, WireServer

from service.agent import tracing
from service.agent.provider import ModelReply
from service.agent.results import ABANDONED_TEXT
from service.agent.state import SessionState
from tests.support import bedrock_wire as bw

pytestmark = pytest.mark.usefixtures("aws_env")

NOVEL = "novel_stop_reason"
CALL = {"toolUse": {"toolUseId": "call_u", "name": "add", "input": {"a": 2, "b": 3}}}


def novel_tool_reply(kind: str) -> Reply:
    args = {"a": 2, "b": 3}
    raw = json.dumps(args)
    pieces = [raw[:5], raw[5:]]
    if kind == "openai_compat":
        events = ow.tool_events([("call_u", "add", pieces)])
        stop = f'"finish_reason":"{NOVEL}"'.encode()
        return Reply(events=[e.replace(b'"finish_reason":"tool_calls"', stop) for e in events])
    if kind == "bedrock":
        return bw.stream(bw.tool_events("call_u", "add", args, stop_reason=NOVEL))
    events = [aw.message_start(), *aw.tool_block(0, "call_u", "add", pieces), *aw.finish(NOVEL)]
    return Reply(events=events)


@pytest.mark.parametrize("kind", KINDS)
async def test_tool_calls_are_kept_unrun_and_the_raw_value_is_logged(
    kind: str, server: WireServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.script(novel_tool_reply(kind), text_reply(kind, "Fine."))
    definition = agent(kind, server, checkpointing=False)
    state = SessionState(session_id="s-novel")

    with caplog.at_level(logging.WARNING):
        result, state = await run(definition, state, "c1", "What is 2 + 3?")

    assert result.stop_reason == "end_turn"
    assert result.message is not None
    assert result.message["content"][-1] == CALL, "the call is kept, not dropped"
    assert len(server.requests) == 1, "the tool did not run, so no second model call"
    warning = next(r for r in caplog.records if "unknown stop reason" in r.getMessage())
    assert warning.levelno == logging.WARNING
    assert NOVEL in warning.getMessage()
    assert "unrun_tool_calls=<1>" in warning.getMessage()

    result, state = await run(definition, state, "c2", "Never mind.")
    assert result.stop_reason == "end_turn"
    assert tool_results_sent(kind, server.requests[1].body) == [("call_u", ABANDONED_TEXT)]


class _Span:
    def __init__(self) -> None:
        self.attributes: dict[str, Any] = {}

    def set(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def failed(self, description: str, error: BaseException | None = None) -> None:
        raise AssertionError(description)


def test_the_model_span_carries_the_raw_stop_reason() -> None:
    span = _Span()
    reply = ModelReply({"role": "assistant", "content": []}, "end_turn", unknown_stop_reason=NOVEL)
    tracing.model_outcome(span, reply, None, cancelled=False)
    assert span.attributes["gen_ai.response.finish_reasons"] == (NOVEL,)
