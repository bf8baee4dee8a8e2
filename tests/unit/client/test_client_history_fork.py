"""``cairn session history`` and ``cairn session fork``: what they publish, where, and what they
print of the answer. Kafka is the in-memory double of the delete tests."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from service.cli import main
from service.client import commands
from service.wire.codec import decode_command, encode_result
from service.wire.commands import ForkCommand, HistoryCommand
from service.wire.results import history_result
from tests.unit.client.test_client_delete import FakeKafka, kafka  # noqa: F401 - fixture

ENTRIES: list[dict[str, Any]] = [
    {"version": 3, "at": 1767225642.0, "command_id": "c3", "stop_reason": "end_turn",
     "cycle_index": 1, "messages": 5},
    {"version": 2, "at": 1767225641.0, "command_id": "c2", "position": "after_tools",
     "stop_reason": "checkpoint", "cycle_index": 0, "messages": 3},
]  # fmt: skip


def _page(next_before: int | None) -> dict[str, Any]:
    record = history_result(
        session_id="s1",
        command_id="{command_id}",
        versions=ENTRIES,
        next_before=next_before,
        oldest_kept=1,
        version=3,
    )
    body: dict[str, Any] = orjson.loads(encode_result(record))
    return body


def test_history_and_fork_commands_validate_and_decode() -> None:
    listing = commands.history("s1", limit=5, before=9, command_id="h1")
    assert isinstance(decode_command(commands.encode(listing), key=b"s1"), HistoryCommand)
    forked = commands.fork("s1", 4, "s2", command_id="f1")
    body = orjson.loads(commands.encode(forked))
    assert body == {"type": "fork", "schema_version": 1, "command_id": "f1", "session_id": "s2",
                    "source_session_id": "s1", "version": 4}  # fmt: skip
    # Keyed by the new session: a record keyed by the source is refused as misrouted.
    assert isinstance(decode_command(commands.encode(forked), key=b"s2"), ForkCommand)
    with pytest.raises(commands.CommandInputError, match="invalid history"):
        commands.history("s1", limit=101)
    with pytest.raises(commands.CommandInputError, match="invalid fork"):
        commands.fork("s1", 0, "s2")


def test_session_history_prints_the_page_newest_first_and_the_next_cursor(
    kafka: FakeKafka,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    kafka.answers = [_page(next_before=2)]
    servers = "127.0.0.1:19092"
    assert main(["session", "history", "s1", "--limit", "2", "--bootstrap-servers", servers]) == 0
    (topic, key, command) = kafka.sent[-1]
    assert (topic, key) == ("cairn.commands", "s1")
    assert command["type"] == "history" and command["limit"] == 2 and "before" not in command
    out = capsys.readouterr().out.splitlines()
    # The next page's command, pasted as it is, asks the same broker for a page of the same size.
    assert out[2:] == [
        "  v3  2026-01-01T00:00:42Z  end_turn, cycle 1, 5 messages  [c3]",
        "  v2  2026-01-01T00:00:41Z  after_tools (paused), cycle 0, 3 messages  [c2]",
        f"  older: cairn session history s1 --bootstrap-servers {servers} --before 2 --limit 2",
    ]


def test_the_next_page_of_the_default_size_is_asked_for_without_a_limit(
    kafka: FakeKafka,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    versions = [{**ENTRIES[0], "version": v} for v in range(30, 10, -1)]
    kafka.answers = [{**_page(next_before=11), "history": {"versions": versions,
                      "next_before": 11, "oldest_kept": 1}}]  # fmt: skip
    assert main(["session", "history", "s1"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "  older: cairn session history s1 --before 11"
    )


def test_session_fork_publishes_to_the_new_session_and_says_where_it_came_from(
    kafka: FakeKafka,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    kafka.answers = [
        {"type": "agent_result", "session_id": "s2", "command_id": "{command_id}",
         "stop_reason": "checkpoint", "message": None,
         "checkpoint": {"position": "after_model", "cycle_index": 0, "schema_version": "1.0"},
         "version": 1, "forked_from": {"session_id": "s1", "version": 4}},
    ]  # fmt: skip
    assert main(["session", "fork", "s1", "--at", "4", "--as", "s2"]) == 0
    (topic, key, command) = kafka.sent[-1]
    assert (topic, key) == ("cairn.commands", "s2")
    assert (command["source_session_id"], command["version"]) == ("s1", 4)
    out = capsys.readouterr().out.splitlines()
    assert "  forked from session s1 at version 4 (this is version 1)" in out
    assert "  next: cairn resume --session s2 --wait" in out
