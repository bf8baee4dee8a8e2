"""At shutdown the service closes every model provider's HTTP client, even past a failing one."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from service.agent.definition import AgentDefinition
from service.agent.provider import ModelChunk, ModelProvider, ModelRequest
from service.app import close_models


class _Provider(ModelProvider):
    def __init__(self, *, fails: bool = False) -> None:
        self.closed = 0
        self.fails = fails

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        raise AssertionError("not called")
        yield

    async def aclose(self) -> None:
        self.closed += 1
        if self.fails:
            raise RuntimeError("connector already gone")


class _WithoutClose(ModelProvider):
    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        raise AssertionError("not called")
        yield


async def test_every_provider_is_closed_and_a_failure_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failing, healthy = _Provider(fails=True), _Provider()
    agents = {
        "a": AgentDefinition(name="a", model=failing),
        "b": AgentDefinition(name="b", model=_WithoutClose()),
        "c": AgentDefinition(name="c", model=healthy),
    }
    with caplog.at_level(logging.WARNING):
        await close_models(agents)
    assert (failing.closed, healthy.closed) == (1, 1)
    assert "agent=<a> | model client did not close" in caplog.text
