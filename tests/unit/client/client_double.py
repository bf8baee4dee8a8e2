"""The client's Kafka access as an in-memory double, for the client tests: a committed session
state, the session's results so far, how often the state was read, and every command published
(each answered at once with a result whose stop reason is ``answer_with``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from service.client import actions
from service.client.kafka_io import Seen
from service.wire.codec import decode_command
from tests.support.fake_reader import FakeReader


def result(command_id: str, stop_reason: str, **fields: Any) -> dict[str, Any]:
    return {
        "type": "agent_result",
        "schema_version": 1,
        "session_id": "s1",
        "command_id": command_id,
        "stop_reason": stop_reason,
        **fields,
    }


class FakeKafka:
    def __init__(self, *, answer_with: str = "end_turn", **extra: dict[str, Any]) -> None:
        self.committed: dict[str, Any] | None = None
        self.results: list[dict[str, Any]] = []
        self.reads = 0
        self.sent: list[dict[str, Any]] = []
        self.answer_with = answer_with
        self.extra = extra
        """Fields of the answering result, by its stop reason."""
        self._unread: list[Seen] = []

    async def session_state(self, settings: object, session_id: str) -> dict[str, Any] | None:
        self.reads += 1
        return self.committed

    async def last_results(
        self, settings: object, session_id: str, limit: int
    ) -> list[dict[str, Any]]:
        return self.results[-limit:]

    async def publish(
        self, kafka: object, topic: str, session_id: str, value: bytes
    ) -> tuple[int, int]:
        # Every command the client sends is one the service decodes.
        decode_command(value)
        command = orjson.loads(value)
        self.sent.append(command)
        fields = self.extra.get(self.answer_with, {})
        body = result(command["command_id"], self.answer_with, **fields)
        self._unread.append(Seen("results", 1, len(self.sent), session_id, body, None))
        return 1, len(self.sent) - 1

    def reader(self, *args: object, **kwargs: object) -> FakeReader:
        return FakeReader(self)


def installed(monkeypatch: pytest.MonkeyPatch, fake: FakeKafka) -> Iterator[FakeKafka]:
    """``fake`` in place of the client's Kafka access (for a fixture to yield from)."""
    monkeypatch.setattr(actions, "session_state", fake.session_state)
    monkeypatch.setattr(actions, "last_results", fake.last_results)
    monkeypatch.setattr(actions, "publish", fake.publish)
    monkeypatch.setattr(actions, "Reader", fake.reader)
    yield fake


def answers_sent(kafka: FakeKafka) -> list[dict[str, Any]]:
    return [item["interruptResponse"] for item in kafka.sent[-1]["resume"]]
