"""``cairn resume`` acts on the session's committed pause and sends nothing it cannot stand behind.

The client's Kafka access is replaced by an in-memory double: a committed session state, the
session's results so far, and a record of what would be published.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from service.cli import main
from service.client import actions
from service.client.kafka_io import Seen
from tests.unit.client.client_double import FakeKafka, answers_sent, installed, result

IID = "v1:tool_call:tooluse_3_0:225d3982-9eb3-5ce9-93ca-f09a444307f7"
CHECKPOINT = {"position": "after_tools", "cycle_index": 1, "schema_version": "1.0"}
ASKING = {
    "role": "assistant",
    "content": [{"toolUse": {"toolUseId": "tooluse_3_0", "name": "request_approval", "input": {}}}],
}


def state(
    *, interrupts: Sequence[str] = (), checkpoint: dict[str, Any] | None = None, running: str = ""
) -> dict[str, Any]:
    """A committed session state (``SessionState.to_dict`` form) paused as asked."""
    pending = {
        "assistant_message": ASKING,
        "results": {},
        "interrupts": [
            {"id": i, "name": "approval", "reason": None, "response": None} for i in interrupts
        ],
    }
    return {
        "session_id": "s1",
        "agent": "demo",
        "messages": [ASKING],
        "checkpoint": checkpoint,
        "cycle_index": 1,
        "pending": pending if interrupts else None,
        "inflight": {"command_id": running, "position": "after_model", "cycle_index": 0}
        if running
        else None,
        "applied_commands": ["c1", "c2"],
    }


REFUSED = result(
    "c3",
    "error",
    error={"code": "interrupt_pending", "message": "only interrupt answers are accepted"},
)
"""The last result after an invoke was refused while the session was paused."""


@pytest.fixture
def kafka(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKafka]:
    extra = {
        "checkpoint": {"checkpoint": {"checkpoint": CHECKPOINT}},
        "interrupt": {"interrupts": [{"id": IID, "name": "approval", "reason": None}]},
    }
    yield from installed(monkeypatch, FakeKafka(answer_with="checkpoint", **extra))


def test_an_error_result_leaves_the_pending_interrupt_answerable(
    kafka: FakeKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    kafka.committed, kafka.results = state(interrupts=[IID]), [REFUSED]

    assert main(["resume", "--session", "s1"]) == 2
    assert f"waits for answers to interrupts ['{IID}']" in capsys.readouterr().err
    assert kafka.sent == []

    assert main(["resume", "--session", "s1", "--answer", "true"]) == 0
    assert answers_sent(kafka) == [{"interruptId": IID, "response": True}]


def test_an_error_result_leaves_the_pending_checkpoint_resumable(kafka: FakeKafka) -> None:
    kafka.committed, kafka.results = state(checkpoint=CHECKPOINT), [REFUSED]
    assert main(["resume", "--session", "s1"]) == 0
    assert kafka.sent[-1]["resume"] == {"checkpointResume": {"checkpoint": CHECKPOINT}}


@pytest.mark.parametrize("answer", ["bogus=true", "v1:tool_call:tooluse_9_9:x=true"])
def test_an_answer_for_an_interrupt_that_is_not_pending_is_refused_unsent(
    kafka: FakeKafka, capsys: pytest.CaptureFixture[str], answer: str
) -> None:
    kafka.committed, kafka.results = state(interrupts=[IID]), [REFUSED]
    assert main(["resume", "--session", "s1", "--answer", answer, "--wait"]) == 2
    err = capsys.readouterr().err
    assert "which is not pending" in err
    assert f"pending: ['{IID}']" in err
    assert kafka.sent == []


def test_a_json_string_holding_an_equals_sign_answers_the_pending_interrupt(
    kafka: FakeKafka,
) -> None:
    kafka.committed = state(interrupts=[IID])
    assert main(["resume", "--session", "s1", "--answer", '"ship it = yes"']) == 0
    assert answers_sent(kafka) == [{"interruptId": IID, "response": "ship it = yes"}]


@pytest.mark.parametrize(
    ("committed", "args", "expected"),
    [
        (None, [], "is not paused at a checkpoint: it has no committed state yet"),
        (state(), [], "is not paused at a checkpoint: it is idle or finished"),
        (state(running="c7"), [], "is not paused at a checkpoint: it is running command c7"),
        (
            state(checkpoint=CHECKPOINT),
            ["--answer", "true"],
            "has no pending interrupt to answer: it is paused at checkpoint after_tools (cycle 1)",
        ),
    ],
)
def test_nothing_to_resume_is_said_plainly(
    kafka: FakeKafka,
    capsys: pytest.CaptureFixture[str],
    committed: dict[str, Any] | None,
    args: list[str],
    expected: str,
) -> None:
    kafka.committed = committed
    assert main(["resume", "--session", "s1", *args]) == 2
    assert expected in capsys.readouterr().err
    assert kafka.sent == []


def test_next_hints_keep_the_bootstrap_servers_given(
    kafka: FakeKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    kafka.committed = state(interrupts=[IID])
    servers = "kafka-1:9092,kafka-2:9092"
    assert main(["resume", "--session", "s1", "--answer", "true", "--wait",
                 "--bootstrap-servers", servers]) == 0  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"  next: cairn resume --session s1 --bootstrap-servers {servers} --wait"

    kafka.answer_with = "interrupt"
    assert (
        main(["invoke", "--session", "s1", "--wait", "--bootstrap-servers", "[::1]:9", "hi"]) == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == (
        "  next: cairn resume --session s1 --bootstrap-servers '[::1]:9' --answer true --wait"
    )

    kafka.results = [result("c1", "checkpoint", checkpoint=CHECKPOINT)]
    assert main(["session", "show", "s1", "--bootstrap-servers", servers]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"    next: cairn resume --session s1 --bootstrap-servers {servers} --wait"

    watched: list[str] = []
    seen = Seen("results", 1, 0, "s1", result("c1", "checkpoint", checkpoint=CHECKPOINT), None)
    actions.write_seen(
        seen, watched.append, prefix_session=True, connection=("--bootstrap-servers", servers)
    )
    assert (
        watched[-1]
        == f"[s1]   next: cairn resume --session s1 --bootstrap-servers {servers} --wait"
    )

    # Settings from the environment need no repeating: the hint carries only what was typed.
    kafka.answer_with = "checkpoint"
    assert main(["resume", "--session", "s1", "--answer", "true", "--wait"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "  next: cairn resume --session s1 --wait"


def test_session_show_says_what_to_do_next_for_its_newest_result_only(
    kafka: FakeKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    """An older result's hint is stale: its pause was resumed, or the session deleted since."""
    deleted = {"session_id": "s1", "state_records": 3, "stopped": None, "skipped": []}
    kafka.results = [
        result("c1", "checkpoint", checkpoint=CHECKPOINT),
        result("c2", "end_turn", deleted=deleted),
    ]
    assert main(["session", "show", "s1"]) == 0
    out = capsys.readouterr().out
    assert "command=c1 stop_reason=checkpoint" in out
    assert "next: cairn resume" not in out

    kafka.results.reverse()
    assert main(["session", "show", "s1"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "    next: cairn resume --session s1 --wait"
