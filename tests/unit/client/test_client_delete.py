"""``cairn session delete`` publishes a delete on the commands topic and prints what it removed.

The client's Kafka access is replaced by an in-memory double that answers each published command
with the results it was given (a stopped invocation's result first, then the delete's own).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from service.cli import main
from service.client import actions, commands, render
from service.client.kafka_io import Seen
from service.wire.codec import decode_command, encode_result
from service.wire.commands import DeleteCommand
from service.wire.results import deleted_result
from tests.support.fake_reader import FakeReader


def deleted(command_id: str, **report: Any) -> dict[str, Any]:
    """A delete's result as the service writes it."""
    fields: dict[str, Any] = {"existed": True, "records": 7, "stopped": None, "skipped": []}
    fields.update(report)
    record = deleted_result(session_id="s1", command_id=command_id, metadata={}, **fields)
    body: dict[str, Any] = orjson.loads(encode_result(record))
    return body


class FakeKafka:
    """Every command published, and the results each one is answered with."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, dict[str, Any]]] = []
        self.answers: list[dict[str, Any]] | None = None
        """Results published for the next command (``{command_id}`` is replaced); None: a delete
        result of 7 records."""
        self.readers = 0
        self._unread: list[Seen] = []

    async def publish(
        self, kafka: object, topic: str, session_id: str, value: bytes
    ) -> tuple[int, int]:
        command = orjson.loads(value)
        self.sent.append((topic, session_id, command))
        answers = self.answers if self.answers is not None else [deleted("{command_id}")]
        for offset, answer in enumerate(answers):
            if answer["command_id"] == "{command_id}":
                answer = {**answer, "command_id": command["command_id"]}
            self._unread.append(Seen("cairn.results", 1, offset, session_id, answer, None))
        return 1, len(self.sent) - 1

    def reader(self, kafka: object, topics: list[str], **kwargs: object) -> FakeReader:
        self.readers += 1
        assert topics == ["cairn.results"], "a delete has no events to follow"
        return FakeReader(self)


@pytest.fixture
def kafka(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKafka]:
    monkeypatch.delenv("CAIRN_TOPICS__COMMANDS", raising=False)
    monkeypatch.delenv("CAIRN_TOPICS__RESULTS", raising=False)
    fake = FakeKafka()
    monkeypatch.setattr(actions, "publish", fake.publish)
    monkeypatch.setattr(actions, "Reader", fake.reader)
    yield fake


def test_a_delete_carries_only_the_common_fields_and_decodes_as_a_delete() -> None:
    command = commands.delete("s1", command_id="c1")
    body = orjson.loads(commands.encode(command))
    assert body == {"type": "delete", "schema_version": 1, "command_id": "c1", "session_id": "s1"}
    assert isinstance(decode_command(commands.encode(command), key=b"s1"), DeleteCommand)
    assert commands.delete("s1").command_id.startswith("cli-")
    with pytest.raises(commands.CommandInputError, match="invalid delete"):
        commands.delete("")


def test_session_delete_publishes_on_the_commands_topic_and_prints_what_it_removed(
    kafka: FakeKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    kafka.answers = [
        {"type": "agent_result", "session_id": "s1", "command_id": "c-12",
         "stop_reason": "cancelled"},
        deleted("{command_id}", stopped="c-12", skipped=["c-13"]),
    ]  # fmt: skip
    assert main(["session", "delete", "--session", "s1", "--command-id", "d1"]) == 0
    (topic, key, command) = kafka.sent[-1]
    assert (topic, key) == ("cairn.commands", "s1")
    assert command == {
        "type": "delete",
        "schema_version": 1,
        "command_id": "d1",
        "session_id": "s1",
    }
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "sent     delete session=s1 command=d1 (partition 1, offset 0)"
    # The stopped invocation's result comes first; the wait ends at the delete's own.
    assert out[1:] == [
        "result   session=s1 command=d1 stop_reason=end_turn",
        "  deleted session s1: 7 state records; stopped c-12; skipped c-13",
    ]


def test_no_wait_publishes_and_reads_nothing(
    kafka: FakeKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["session", "delete", "--session", "s1", "--no-wait"]) == 0
    assert len(kafka.sent) == 1 and kafka.readers == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("sent     delete session=s1 command=cli-")


def test_no_result_within_the_timeout_is_said_plainly_with_a_status_of_its_own(
    kafka: FakeKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    kafka.answers = []
    assert main(["session", "delete", "--session", "s1", "--command-id", "d1",
                 "--timeout", "0.05"]) == 3  # fmt: skip
    assert "no result for command d1 within 0.05s" in capsys.readouterr().err


def test_an_error_result_exits_with_status_1(
    kafka: FakeKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    kafka.answers = [
        {"type": "agent_result", "session_id": "s1", "command_id": "{command_id}",
         "stop_reason": "error", "error": {"code": "internal", "message": "boom"}},
    ]  # fmt: skip
    assert main(["session", "delete", "--session", "s1"]) == 1
    assert "  error: internal: boom" in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize(
    ("report", "line"),
    [
        ({"existed": False, "records": 0}, "nothing to delete: session s1 has no state"),
        ({"records": 1}, "deleted session s1: 1 state record"),
        (
            {"existed": False, "records": 0, "skipped": ["c-2"]},
            "deleted session s1: 0 state records; skipped c-2",
        ),
        (
            {"skipped": [f"c-{i}" for i in range(12)]},
            "deleted session s1: 7 state records; skipped "
            + ", ".join(f"c-{i}" for i in range(10))
            + " and 2 more",
        ),
    ],
)
def test_the_deleted_report_is_one_plain_line(report: dict[str, Any], line: str) -> None:
    result = deleted("d1", **report)
    assert render.deleted_line(result) == line
    assert render.result_lines(result)[-1] == "  " + line
    # Results of other commands carry no report and show none.
    assert not any("delete" in x for x in render.result_lines({**result, "deleted": None}))
