"""What the client builds from typed input, and how it shows what comes back (no broker needed)."""

from __future__ import annotations

import shlex
import subprocess

import orjson
import pytest
from aiokafka.partitioner import DefaultPartitioner

from service.cli import build_parser, main
from service.client import actions, commands, render
from service.client.kafka_io import partition_for
from service.wire.commands import CancelCommand, InvokeCommand, ResumeCommand

CHECKPOINT = {"position": "after_model", "cycle_index": 0, "schema_version": "1.0"}
IID = "v1:tool_call:tooluse_3_0:225d3982-9eb3-5ce9-93ca-f09a444307f7"


def test_commands_encode_only_what_was_given_and_validate_on_the_way_out() -> None:
    body = orjson.loads(commands.encode(commands.invoke("s1", "demo", "hi", command_id="c1")))
    assert body == {
        "type": "invoke",
        "schema_version": 1,
        "command_id": "c1",
        "session_id": "s1",
        "agent": "demo",
        "prompt": "hi",
    }
    assert InvokeCommand.model_validate(body).prompt == "hi"
    cancel = orjson.loads(
        commands.encode(commands.cancel("s1", target_command_id="c1", after_current_tools=True))
    )
    assert CancelCommand.model_validate(cancel).after_current_tools
    assert cancel["command_id"].startswith("cli-")
    resume = orjson.loads(commands.encode(commands.resume_from_checkpoint("s1", CHECKPOINT)))
    assert ResumeCommand.model_validate(resume).engine_input() == {
        "checkpointResume": {"checkpoint": CHECKPOINT}
    }


@pytest.mark.parametrize(
    "build",
    [
        lambda: commands.invoke("", "demo", "hi"),
        lambda: commands.invoke("s", "demo", ""),
        lambda: commands.resume_from_checkpoint("s", {"position": "nowhere"}),
        lambda: commands.resume_with_answers("s", {}),
    ],
)
def test_invalid_input_fails_before_anything_is_sent(build: object) -> None:
    with pytest.raises(commands.CommandInputError, match="invalid"):
        build()  # type: ignore[operator]


def test_answers_by_id_or_bare_for_the_only_pending_interrupt() -> None:
    assert commands.parse_answers([f"{IID}=true"], [IID]) == {IID: True}
    assert commands.parse_answers(['{"approved": false}'], [IID]) == {IID: {"approved": False}}
    assert commands.parse_answers(["yes"], [IID]) == {IID: "yes"}
    assert commands.parse_answers([f'{IID}={{"a": "x=y"}}'], [IID]) == {IID: {"a": "x=y"}}
    assert commands.parse_answers(["a:b=null", "c:d=1"], ["a:b", "c:d"]) == {
        "a:b": None,
        "c:d": 1,
    }
    with pytest.raises(commands.CommandInputError, match="names no interrupt id"):
        commands.parse_answers(["true"], ["a:1", "a:2"])


@pytest.mark.parametrize(
    "raw", ["tru", "True", "nul", "FALSE", "", " ", '{"approved": tru', "[1,", '"open', "1.2.3"]
)
def test_an_answer_that_is_json_gone_wrong_is_refused_not_sent_as_text(raw: str) -> None:
    with pytest.raises(commands.CommandInputError, match="is not valid JSON"):
        commands.parse_answers([raw], [IID])
    with pytest.raises(commands.CommandInputError, match="is not valid JSON"):
        commands.parse_answers([f"{IID}={raw}"], [IID])


@pytest.mark.parametrize("raw", ["yes", "no", "n", "ship it", "approved, go ahead"])
def test_a_plain_text_answer_is_sent_as_a_string(raw: str) -> None:
    assert commands.parse_answers([raw], [IID]) == {IID: raw}


@pytest.mark.parametrize("pending", [[IID], [IID, "v1:tool_call:tooluse_3_1:other"]])
@pytest.mark.parametrize("raw", ["bogus=true", f"{IID[:-1]}=true", "x=y", "=true"])
def test_an_answer_naming_no_pending_interrupt_is_refused(raw: str, pending: list[str]) -> None:
    with pytest.raises(commands.CommandInputError) as caught:
        commands.parse_answers([raw], pending)
    message = str(caught.value)
    assert f"names interrupt {raw.partition('=')[0]!r}, which is not pending" in message
    assert f"pending: {pending}" in message


def test_json_answers_holding_an_equals_sign_answer_the_only_pending_interrupt() -> None:
    assert commands.parse_answers(['"a=b"'], [IID]) == {IID: "a=b"}
    assert commands.parse_answers(['{"note": "x=y"}'], [IID]) == {IID: {"note": "x=y"}}
    assert commands.parse_answers(['["=", 1]'], [IID]) == {IID: ["=", 1]}
    assert commands.parse_answers([f'{IID}="a=b"'], [IID]) == {IID: "a=b"}
    # An id that holds "=" or extends another pending id still gets its own answer.
    assert commands.parse_answers(["a:1=b=true", "a:1=false"], ["a:1", "a:1=b"]) == {
        "a:1=b": True,
        "a:1": False,
    }


def test_answers_are_refused_when_nothing_is_pending() -> None:
    with pytest.raises(commands.CommandInputError, match="no interrupt is pending"):
        commands.parse_answers([f"{IID}=true"], [])
    answers = commands.resume_with_answers("s", {IID: None})
    assert orjson.loads(commands.encode(answers))["resume"] == [
        {"interruptResponse": {"interruptId": IID, "response": None}}
    ]


def test_partition_for_matches_the_kafka_default_partitioner() -> None:
    partitions = list(range(12))
    for key in ("s1", "session-42", "ü-ñ", "x" * 200):
        assert partition_for(key, 12) == DefaultPartitioner()(key.encode(), partitions, partitions)


def test_results_show_the_pause_and_what_to_do_next() -> None:
    checkpoint = render.result_lines(
        {
            "session_id": "s1",
            "command_id": "c1",
            "stop_reason": "checkpoint",
            "checkpoint": CHECKPOINT,
            "message": {
                "role": "assistant",
                "content": [
                    {"text": "Let me see."},
                    {"toolUse": {"toolUseId": "t1", "name": "calculator", "input": {"e": "1+1"}}},
                ],
            },
        }
    )
    assert checkpoint[0] == "result   session=s1 command=c1 stop_reason=checkpoint"
    assert "  checkpoint: after_model (cycle 0)" in checkpoint
    assert '  assistant: tool call calculator {"e":"1+1"}  [t1]' in checkpoint
    assert checkpoint[-1] == "  next: cairn resume --session s1 --wait"

    interrupt = render.result_lines(
        {
            "session_id": "s 2",
            "command_id": "c2",
            "stop_reason": "interrupt",
            "interrupts": [{"id": IID, "name": "approval", "reason": {"action": "x"}}],
        }
    )
    assert f"    id: {IID}" in interrupt
    assert interrupt[-1] == "  next: cairn resume --session 's 2' --answer true --wait"

    error = render.result_lines(
        {
            "session_id": "s",
            "command_id": "c",
            "stop_reason": "error",
            "error": {"code": "unknown_agent", "message": "no agent 'x'"},
        }
    )
    assert "  error: unknown_agent: no agent 'x'" in error


def test_events_are_one_line_each_and_text_only_messages_are_skipped() -> None:
    base = {"session_id": "s", "command_id": "c", "seq": 4}
    assert render.event_line(base | {"type": "tool_started", "name": "w", "tool_use_id": "t"}) == (
        "  · #4 tool started: w [t]"
    )
    line = render.event_line(
        base
        | {
            "type": "checkpoint_reached",
            "position": "after_tools",
            "cycle_index": 1,
            "paused": False,
        }
    )
    assert line == "  · #4 checkpoint: after_tools (cycle 1, durable, running on)"
    text_only = {"role": "assistant", "content": [{"text": "done"}]}
    assert render.event_line(base | {"type": "model_message", "message": text_only}) is None
    unknown = render.event_line(base | {"type": "future_kind", "x": 1})
    assert unknown is not None
    assert '"future_kind"' in unknown


def test_state_shows_the_pause_point_and_pending_interrupts() -> None:
    assert render.state_lines(None) == ["state: none (the session has no committed state)"]
    lines = render.state_lines(
        {
            "session_id": "s",
            "agent": "demo",
            "messages": [{"role": "user", "content": [{"text": "hi"}]}],
            "cycle_index": 1,
            "checkpoint": None,
            "pending": {"interrupts": [{"id": IID, "name": "approval", "reason": None}]},
            "inflight": None,
            "applied_commands": ["c1", "c2"],
        }
    )
    assert "  paused at: interrupt (answer to continue)" in lines
    assert f"    approval id={IID} reason=null" in lines
    assert "  last applied commands: c1, c2" in lines


def test_state_lists_only_the_interrupts_still_waiting_for_an_answer() -> None:
    answered = {"id": "v1:tool_call:t0:x", "name": "ask-a", "reason": None, "response": "A"}
    lines = render.state_lines(
        {
            "session_id": "s",
            "agent": "demo",
            "messages": [],
            "cycle_index": 0,
            "checkpoint": None,
            "pending": {"interrupts": [answered, {"id": IID, "name": "approval", "reason": None}]},
        }
    )
    assert f"    approval id={IID} reason=null" in lines
    assert not any("ask-a" in line for line in lines)
    assert "    (1 interrupt of this batch already answered)" in lines


@pytest.mark.parametrize(
    "argv",
    [
        ["session", "fork", "s", "--at", "99999999999999999999999", "--as", "t"],
        ["session", "fork", "s", "--at", "0", "--as", "t"],
        ["session", "history", "s", "--before", str(2**63)],
        ["session", "show", "s", "--results", "0"],
        ["invoke", "--session", "s", "--timeout", "-1", "hi"],
        ["invoke", "--session", "s", "--timeout", "nan", "hi"],
    ],
)
def test_numbers_no_command_can_carry_are_refused_as_usage_errors(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(argv)
    assert caught.value.code == 2
    [line] = [x for x in capsys.readouterr().err.splitlines() if "error:" in x]
    flag = next(arg for arg in argv if arg.startswith("--") and arg != "--session")
    assert f"error: argument {flag}: " in line


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["invoke", "--session", "x", "--bogus", "hi"], "invoke"),
        (["session", "history", "x", "--bogus"], "session history"),
        (["watch", "--session", "x", "--bogus"], "watch"),
        (["topics", "create", "--bogus"], "topics create"),
    ],
)
def test_an_unknown_option_is_refused_after_the_usage_of_the_command_given(
    argv: list[str], command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: cairn {command} ")
    assert err.endswith(f"cairn {command}: error: unrecognized arguments: --bogus\n")


def test_text_from_the_wire_cannot_drive_the_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    hostile = "s-1\x1b]0;owned\x07\x1b[2J\rfake\x9b"
    render.show(f"session {hostile}:\tdone\nnext")
    assert (
        capsys.readouterr().out
        == "session s-1\\x1b]0;owned\\x07\\x1b[2J\\rfake\\x9b:\tdone\nnext\n"
    )


def test_a_bootstrap_option_aiokafka_would_choke_on_is_refused_by_the_parser(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It replaces the setting unchecked, so it is checked as the setting is."""
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["watch", "--bootstrap-servers", "127.0.0.1:99999"])
    assert exited.value.code == 2
    assert "port is not a number from 1 to 65535" in capsys.readouterr().err
    args = build_parser().parse_args(["watch", "--bootstrap-servers", "[::1]:9092"])
    assert args.bootstrap_servers == "[::1]:9092"


HOSTILE_IDS = ["e\x1b[31mvil\x07", "a\u202eb.exe", "tab\there", "it's\\n\x9b", "plain-1", "it's"]


def _read_back_by_bash(word: str) -> str:
    done = subprocess.run(
        ["bash", "-c", f"printf '%s' {word}"], capture_output=True, check=True, timeout=10
    )
    return done.stdout.decode()


@pytest.mark.parametrize("session", HOSTILE_IDS)
def test_a_next_hint_pasted_into_a_shell_names_the_same_session(
    session: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Printed, the hint's id went through the terminal escapes (``'e\\x1b[31m...'``), which a
    shell reads literally: pasted, it named another session."""
    result = {"session_id": session, "command_id": "c", "stop_reason": "checkpoint"}
    for line in render.result_lines(result, ("--bootstrap-servers", "h:1")):
        render.show(line)
    [hint] = [line for line in capsys.readouterr().out.splitlines() if "next:" in line]
    start, _, rest = hint.partition("--session ")
    assert start == "  next: cairn resume "
    word, _, options = rest.partition(" --bootstrap-servers ")
    assert options == "h:1 --wait"
    assert _read_back_by_bash(word) == session
    if session.isprintable():
        assert word == shlex.quote(session)


def test_every_id_in_a_hint_is_quoted_for_the_shell() -> None:
    session, interrupt = "s\x1b1", "v1:tool_call:x\u202e"
    lines = render.next_step_lines(
        {
            "session_id": session,
            "stop_reason": "interrupt",
            "interrupts": [{"id": interrupt}, {"id": "other"}],
        }
    )
    assert lines == [
        "  next: cairn resume --session $'s\\0331' --answer $'v1:tool_call:x\\342\\200\\256=true' "
        "--answer other=true --wait"
    ]
    page = {"versions": [{"version": 4}], "next_before": 4}
    older = render.history_lines({"session_id": "a b\x07", "history": page})[-1]
    assert older == "  older: cairn session history $'a b\\007' --before 4 --limit 1"


def test_an_id_with_bidi_controls_is_shown_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    """U+202E reverses what follows on the line: shown raw, ``evil\u202etxt.exe`` reads as
    another id. Shown as the error messages (a ``repr``) show it."""
    state = {"session_id": "evil\u202etxt.exe\u2066", "agent": "demo", "messages": []}
    for line in render.state_lines(state):
        render.show(line)
    out = capsys.readouterr().out
    assert "session  evil\\u202etxt.exe\\u2066  agent=demo" in out
    assert "\u202e" not in out and "\u2066" not in out
    assert "\\u202e" in repr("evil\u202e")


CHECKPOINT_JSON = orjson.dumps(CHECKPOINT).decode()


LONG_ID = "x" * 257
EMPTY = "an id cannot be empty"
TOO_LONG = "an id is at most 256 characters, this one has 257"


@pytest.mark.parametrize(
    ("argv", "option", "says"),
    [
        (["invoke", "--session", "s", "--command-id", "", "hi"], "--command-id", EMPTY),
        (["invoke", "--session", "", "hi"], "--session", EMPTY),
        (["invoke", "--session", "s", "--agent", "", "hi"], "--agent", EMPTY),
        (["invoke", "--session", LONG_ID, "hi"], "--session", TOO_LONG),
        (["resume", "--session", "s", "--checkpoint", CHECKPOINT_JSON, "--command-id", ""],
         "--command-id", EMPTY),
        (["resume", "--session", "s", "--retry", "--interrupt", ""], "--interrupt", EMPTY),
        (["cancel", "--session", "s", "--command-id", ""], "--command-id", EMPTY),
        (["cancel", "--session", "s", "--command", ""], "--command", EMPTY),
        (["watch", "--session", ""], "--session", EMPTY),
        (["session", "show", ""], "session", EMPTY),
        (["session", "history", LONG_ID], "session", TOO_LONG),
        (["session", "fork", "s", "--at", "1", "--as", ""], "--as", EMPTY),
        (["session", "delete", "--session", "s", "--command-id", ""], "--command-id", EMPTY),
    ],
)  # fmt: skip
def test_an_id_the_wire_refuses_is_refused_with_the_usage_before_anything_is_sent(
    argv: list[str],
    option: str,
    says: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An empty ``--command-id`` was once taken for none: a random id went out instead, one the
    person could not know. An id the wire refuses is named by its option, as any other argument
    is, with the usage line."""

    async def sent(*args: object) -> tuple[int, int]:
        raise AssertionError("a command with an id the wire refuses was sent")

    monkeypatch.setattr(actions, "publish", sent)
    monkeypatch.setenv("CAIRN_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:1")  # no broker, ever
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: cairn ")
    assert f"error: argument {option}: {says}" in err.splitlines()[-1]


def test_an_id_of_the_longest_length_the_wire_takes_is_taken() -> None:
    longest = "x" * 256
    args = build_parser().parse_args(
        ["invoke", "--session", longest, "--command-id", longest, "hi"]
    )
    assert args.session == longest and args.command_id == longest


@pytest.mark.parametrize(
    ("limit", "says"), [("0", "0 is not from 1 to 100"), ("101", "101 is not from 1 to 100")]
)
def test_a_history_page_size_is_refused_with_the_range_the_service_takes(
    limit: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(["session", "history", "s", "--limit", limit])
    assert caught.value.code == 2
    assert f"error: argument --limit: {says}" in capsys.readouterr().err
    assert build_parser().parse_args(["session", "history", "s", "--limit", "100"]).limit == 100


def test_a_refused_command_is_explained_as_the_service_would_explain_it() -> None:
    with pytest.raises(commands.CommandInputError) as caught:
        commands.resume_from_checkpoint("s", [1])  # type: ignore[arg-type]
    assert str(caught.value) == (
        "invalid resume: resume.checkpointResume.checkpoint: must be an object, got an array"
    )
    with pytest.raises(commands.CommandInputError) as caught:
        commands.resume_from_checkpoint("s", {"schema_version": 1.0, "position": "after_model"})
    assert "schema_version: Input should be '1.0', got a number" in str(caught.value)
