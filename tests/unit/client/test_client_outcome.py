"""``cairn resume`` answers a ``tool_outcome_unknown`` interrupt, and the client shows it plainly.

The answer is checked as the engine checks it before anything is read or sent; the interrupt it
answers is the only one pending or the one ``--interrupt`` names. The client's Kafka access is
an in-memory double: a committed session state, its results, and what would be published.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from service.agent.outcomes import (
    OUTCOME_UNKNOWN,
    answer_problem,
    outcome_interrupt_id,
    outcome_reason,
)
from service.cli import main
from service.client import actions, commands, render
from tests.unit.client.client_double import FakeKafka, answers_sent, installed, result

STARTED_AT = datetime(2026, 11, 30, 10, 0, tzinfo=UTC).timestamp()
T1, T2 = outcome_interrupt_id("t1"), outcome_interrupt_id("t2")
APPROVAL = "v1:tool_call:t3:225d3982-9eb3-5ce9-93ca-f09a444307f7"


def outcome(tool_use_id: str, **reason: Any) -> dict[str, Any]:
    """A ``tool_outcome_unknown`` interrupt as the engine raises it."""
    use = {"toolUseId": tool_use_id, "name": "pay_invoice", "input": {"invoice": "A-1"}}
    started = {"at": STARTED_AT, "instance": "cairn-7d9f-2:4411"}
    body = outcome_reason(use, started, f"s:{tool_use_id}") | reason
    return {
        "id": outcome_interrupt_id(tool_use_id),
        "name": OUTCOME_UNKNOWN,
        "reason": body,
        "response": None,
    }


APPROVAL_INTERRUPT = {"id": APPROVAL, "name": "approval", "reason": None, "response": None}
OUTCOME_LINE = (
    "outcome unknown: tool pay_invoice (toolUseId t1, idempotency key s:t1) started "
    "2026-11-30T10:00:00Z on cairn-7d9f-2:4411 — it may or may not have run; answer with "
    "--supply-result JSON, --retry or --fail MSG"
)


def state(*interrupts: dict[str, Any], checkpoint: dict[str, Any] | None = None) -> dict[str, Any]:
    """A committed session state (``SessionState.to_dict`` form) waiting on ``interrupts``."""
    asking = {"role": "assistant", "content": [{"text": "Paying."}]}
    pending = {"assistant_message": asking, "results": {}, "interrupts": list(interrupts)}
    return {
        "session_id": "s1",
        "agent": "demo",
        "messages": [asking],
        "checkpoint": checkpoint,
        "cycle_index": 0,
        "pending": pending if interrupts else None,
        "inflight": None,
        "applied_commands": ["c1"],
    }


@pytest.fixture
def kafka(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKafka]:
    yield from installed(monkeypatch, FakeKafka())


def resume(*args: str) -> int:
    return main(["resume", "--session", "s1", *args])


@pytest.mark.parametrize(
    ("args", "response"),
    [
        (
            ["--supply-result", '{"content": [{"json": {"payment_id": "p1"}}]}'],
            {"result": {"content": [{"json": {"payment_id": "p1"}}]}},
        ),
        (
            ["--supply-result", '{"content": [{"text": "declined"}], "status": "error"}'],
            {"result": {"content": [{"text": "declined"}], "status": "error"}},
        ),
        (["--retry"], {"retry": True}),
        (["--fail", "the bank has no such payment"], {"fail": "the bank has no such payment"}),
    ],
)
def test_each_flag_sends_its_answer_to_the_only_pending_outcome(
    kafka: FakeKafka, args: list[str], response: dict[str, Any]
) -> None:
    kafka.committed = state(outcome("t1"))
    assert resume(*args, "--wait") == 0
    assert answers_sent(kafka) == [{"interruptId": T1, "response": response}]
    assert answer_problem(response) is None


def test_the_only_pending_outcome_is_picked_beside_other_interrupts(kafka: FakeKafka) -> None:
    kafka.committed = state(APPROVAL_INTERRUPT, outcome("t1"))
    assert resume("--retry") == 0
    assert answers_sent(kafka) == [{"interruptId": T1, "response": {"retry": True}}]


def test_with_several_pending_interrupt_picks_one(
    kafka: FakeKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    kafka.committed = state(outcome("t1"), outcome("t2"))
    assert resume("--retry") == 2
    assert (
        f"has 2 pending {OUTCOME_UNKNOWN} interrupts: pick one with --interrupt ID: ['{T1}', "
        f"'{T2}']" in capsys.readouterr().err
    )
    assert kafka.sent == []

    assert resume("--fail", "not paid", "--interrupt", T2) == 0
    assert answers_sent(kafka) == [{"interruptId": T2, "response": {"fail": "not paid"}}]


def test_an_outcome_answered_before_is_no_longer_pending(
    kafka: FakeKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    # A partial answer leaves the answered interrupt in the state, with its response, until the
    # batch completes; the result listed only the open one, and the client counts the same.
    kafka.committed = state(outcome("t1") | {"response": {"fail": "not paid"}}, outcome("t2"))
    assert resume("--retry") == 0
    assert answers_sent(kafka) == [{"interruptId": T2, "response": {"retry": True}}]
    assert resume("--retry", "--interrupt", T1) == 2
    assert f"pending: ['{T2}']" in capsys.readouterr().err


def test_a_plain_answer_goes_to_the_one_interrupt_still_open(kafka: FakeKafka) -> None:
    answered = APPROVAL_INTERRUPT | {"response": True}
    other = "v1:tool_call:t4:1dce052e-1576-5b2a-a34a-e8851ec97e03"
    kafka.committed = state(
        answered, {"id": other, "name": "ask", "reason": None, "response": None}
    )
    assert resume("--answer", "yes") == 0
    assert answers_sent(kafka) == [{"interruptId": other, "response": "yes"}]


@pytest.mark.parametrize("named", [APPROVAL, outcome_interrupt_id("t9"), "bogus"])
def test_interrupt_must_name_a_pending_outcome(
    kafka: FakeKafka, capsys: pytest.CaptureFixture[str], named: str
) -> None:
    kafka.committed = state(APPROVAL_INTERRUPT, outcome("t1"))
    assert resume("--retry", "--interrupt", named) == 2
    assert (
        f"interrupt {named!r} is not a pending {OUTCOME_UNKNOWN} interrupt of session 's1'; "
        f"pending: ['{T1}']" in capsys.readouterr().err
    )
    assert kafka.sent == []


@pytest.mark.parametrize(
    ("committed", "why"),
    [
        (None, "it has no committed state yet"),
        (state(), "it is idle or finished"),
        (state(APPROVAL_INTERRUPT), f"it waits for answers to interrupts ['{APPROVAL}']"),
        (
            state(checkpoint={"position": "after_model", "cycle_index": 0}),
            "it is paused at checkpoint after_model (cycle 0)",
        ),
    ],
)
def test_with_no_pending_outcome_the_answer_is_refused_plainly(
    kafka: FakeKafka,
    capsys: pytest.CaptureFixture[str],
    committed: dict[str, Any] | None,
    why: str,
) -> None:
    kafka.committed = committed
    assert resume("--retry") == 2
    err = capsys.readouterr().err
    assert f"session 's1' has no pending {OUTCOME_UNKNOWN} interrupt to answer: {why}" in err
    assert kafka.sent == []


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--supply-result", "paid"], "--supply-result is not valid JSON"),
        (
            ["--supply-result", '{"status": "success"}'],
            "--supply-result is not an answer to tool_outcome_unknown: result: content is "
            "missing: it must be a list of blocks",
        ),
        (
            ["--supply-result", '{"content": [], "by": "me"}'],
            "result must be an object with content and an optional status",
        ),
        (["--supply-result", "[]"], "result must be an object with content"),
        (
            ["--supply-result", '{"content": [{"text": 1}]}'],
            "result: content[0].text must be a string",
        ),
        (
            ["--supply-result", '{"content": [], "status": "done"}'],
            "result: status must be 'success' or 'error', not 'done'",
        ),
        (["--fail", ""], "--fail is not an answer to tool_outcome_unknown: fail must be a non-"),
        (["--fail", "  "], "fail must be a non-empty message"),
    ],
)
def test_a_malformed_answer_is_refused_before_the_session_is_read(
    kafka: FakeKafka, capsys: pytest.CaptureFixture[str], args: list[str], problem: str
) -> None:
    kafka.committed = state(outcome("t1"))
    assert resume(*args, "--wait") == 2
    assert problem in capsys.readouterr().err
    assert (kafka.reads, kafka.sent) == (0, [])


@pytest.mark.parametrize(
    "args",
    [
        ["--retry", "--fail", "x"],
        ["--supply-result", '{"content": []}', "--retry"],
        ["--answer", "true", "--fail", "x"],
        ["--checkpoint", "{}", "--retry"],
    ],
)
def test_the_ways_to_resume_are_mutually_exclusive(
    kafka: FakeKafka, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    kafka.committed = state(outcome("t1"))
    with pytest.raises(SystemExit) as exited:
        resume(*args)
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    assert kafka.sent == []


async def test_callers_of_the_library_get_the_same_refusals(kafka: FakeKafka) -> None:
    with pytest.raises(commands.CommandInputError, match="give only one of --retry, --fail"):
        commands.outcome_answer(retry=True, fail="x")
    assert commands.outcome_answer() is None
    with pytest.raises(commands.CommandInputError, match="give only one of --answer, "):
        await actions.resume(
            object(),  # type: ignore[arg-type]
            session_id="s1",
            checkpoint_json=None,
            answers=["true"],
            command_id=None,
            options=actions.WaitOptions(),
            outcome={"retry": True},
        )
    assert kafka.reads == 0


def test_interrupt_without_an_outcome_answer_is_refused(
    kafka: FakeKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    kafka.committed = state(outcome("t1"))
    assert resume("--answer", '{"retry": true}', "--interrupt", T1) == 2
    assert "--interrupt picks the interrupt that --supply-result" in capsys.readouterr().err
    assert kafka.sent == []


def test_answer_to_an_outcome_is_checked_as_the_engine_checks_it(
    kafka: FakeKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    kafka.committed = state(outcome("t1"))
    assert resume("--answer", "true") == 2
    err = capsys.readouterr().err
    assert f"answer for '{T1}' is not an answer to {OUTCOME_UNKNOWN}" in err
    assert "(use --supply-result JSON, --retry or --fail MSG)" in err
    assert kafka.sent == []

    assert resume("--answer", '{"retry": true}') == 0
    assert answers_sent(kafka) == [{"interruptId": T1, "response": {"retry": True}}]


def test_a_bare_resume_points_at_the_outcome_flags(
    kafka: FakeKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    kafka.committed = state(outcome("t1"))
    assert resume() == 2
    assert "use --supply-result JSON, --retry or --fail MSG" in capsys.readouterr().err

    kafka.committed = state(APPROVAL_INTERRUPT, outcome("t1"))
    assert resume() == 2
    assert (
        "use --answer ID=JSON, or --supply-result JSON, --retry or --fail MSG for "
        "tool_outcome_unknown" in capsys.readouterr().err
    )


def test_a_result_shows_the_unknown_outcome_and_how_to_answer_it() -> None:
    lines = render.result_lines(result("c1", "interrupt", interrupts=[outcome("t1")]))
    assert lines[1:3] == [f"  {OUTCOME_LINE}", f"    id: {T1}"]
    assert lines[-1] == (
        "  next: cairn resume --session s1 (--supply-result JSON | --retry | --fail MSG) --wait"
    )


def test_several_interrupts_get_a_hint_each() -> None:
    lines = render.result_lines(
        result("c1", "interrupt", interrupts=[APPROVAL_INTERRUPT, outcome("t1"), outcome("t2")])
    )
    assert [line for line in lines if line.startswith("  next:")] == [
        f"  next: cairn resume --session s1 --answer {APPROVAL}=true --wait",
        f"  next: cairn resume --session s1 --interrupt {T1} "
        "(--supply-result JSON | --retry | --fail MSG) --wait",
        f"  next: cairn resume --session s1 --interrupt {T2} "
        "(--supply-result JSON | --retry | --fail MSG) --wait",
    ]


def test_a_reason_without_start_or_instance_is_still_shown() -> None:
    line = render.outcome_line(outcome("t1", started_at=None, instance=""))
    assert line is not None
    assert "started at an unknown time on an unknown instance — it may" in line
    assert render.outcome_line(outcome("t1", started_at=1e300)) is not None
    assert render.outcome_line(APPROVAL_INTERRUPT) is None


def test_session_show_shows_the_pending_unknown_outcome(
    kafka: FakeKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    kafka.committed = state(APPROVAL_INTERRUPT, outcome("t1"))
    assert main(["session", "show", "s1"]) == 0
    out = capsys.readouterr().out.splitlines()
    start = out.index("  paused at: interrupt (answer to continue)")
    assert out[start + 1 : start + 4] == [
        f"    approval id={APPROVAL} reason=null",
        f"    {OUTCOME_LINE}",
        f"      id: {T1}",
    ]


def test_cited_text_is_shown_with_its_sources() -> None:
    def cited(*titles: str | None) -> dict[str, Any]:
        citations = [
            {"location": {"web": {"url": "u"}}, **({"title": t} if t else {})} for t in titles
        ]
        parts = [{"text": "Lisbon is "}, {"text": "sunny."}]
        return {"citationsContent": {"citations": citations, "content": parts}}

    message = {"role": "assistant", "content": [cited("Forecast", "Forecast", "Almanac")]}
    assert render.message_lines(message) == [
        "  assistant: Lisbon is sunny.  [cited: Forecast, Almanac]"
    ]
    assert render.block_lines(cited(None, None)) == ["Lisbon is sunny.  [cited: 2 citations]"]
    assert render.block_lines(cited(None)) == ["Lisbon is sunny.  [cited: 1 citation]"]
    with_call = {
        "content": [
            cited("Forecast"),
            {"toolUse": {"name": "weather", "input": {}, "toolUseId": "t"}},
        ]
    }
    assert render.message_summary(with_call) == "Lisbon is sunny. -> weather({})"
