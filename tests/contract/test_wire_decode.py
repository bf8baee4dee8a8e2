"""Decoding commands and control records: what is accepted, and the exact error for what is not."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from service.runtime.records import parse_command
from service.runtime.work import InputRecord, Origin
from service.wire.codec import (
    DEFAULT_MAX_RECORD_BYTES,
    MAX_DEPTH,
    decode_command,
    decode_control,
    encode,
    encode_result,
)
from service.wire.commands import CancelCommand, DeleteCommand, InvokeCommand, ResumeCommand
from service.wire.errors import WireError
from service.wire.refusal_text import OUT_OF_RANGE
from service.wire.results import error_record

CHECKPOINT = {"position": "after_model", "cycle_index": 0, "schema_version": "1.0"}
INVOKE: dict[str, Any] = {
    "type": "invoke",
    "schema_version": 1,
    "command_id": "c-1",
    "session_id": "s-1",
    "agent": "support",
    "prompt": "hello",
}
RESUME: dict[str, Any] = {
    "type": "resume",
    "schema_version": 1,
    "command_id": "c-2",
    "session_id": "s-1",
    "resume": {"checkpointResume": {"checkpoint": CHECKPOINT}},
}
CANCEL: dict[str, Any] = {
    "type": "cancel",
    "schema_version": 1,
    "command_id": "c-3",
    "session_id": "s-1",
}
DELETE: dict[str, Any] = {
    "type": "delete",
    "schema_version": 1,
    "command_id": "c-4",
    "session_id": "s-1",
}
ANSWER = {"interruptResponse": {"interruptId": "v1:before_tools:x", "response": {"ok": True}}}


def raw(value: dict[str, Any]) -> bytes:
    return orjson.dumps(value)


def refused(value: bytes, **kwargs: Any) -> WireError:
    with pytest.raises(WireError) as caught:
        decode_command(value, **kwargs)
    return caught.value


@pytest.mark.parametrize(
    "prompt",
    [
        "hello",
        [{"text": "hello"}, {"image": {"format": "png", "source": {"bytes": "aGk="}}}],
        [
            {"role": "user", "content": [{"text": "hi"}]},
            {"role": "assistant", "content": [{"text": "hello"}]},
            {"role": "user", "content": [{"text": "go on"}]},
        ],
    ],
    ids=["text", "blocks", "messages"],
)
def test_invoke_prompt_shapes_are_accepted_and_reencode_unchanged(prompt: Any) -> None:
    value = raw({**INVOKE, "prompt": prompt, "checkpointing": True, "metadata": {"k": [1]}})
    command = decode_command(value)
    assert isinstance(command, InvokeCommand)
    assert command.engine_input() == prompt
    assert orjson.loads(encode(command)) == orjson.loads(value)


def test_messages_as_the_strands_sdk_keeps_them_are_accepted_as_role_and_content() -> None:
    """The Strands SDK (1.62) adds ``tracking_id`` and ``metadata`` to the messages it keeps and
    strips them before a model call: its ``agent.messages`` given as a prompt are taken, the
    engine gets role and content only."""
    usage = {"inputTokens": 3, "outputTokens": 2, "totalTokens": 5}
    prompt = [
        {"role": "user", "content": [{"text": "hi"}], "tracking_id": "0b5c4c1e-8f0e-4c55"},
        {
            "role": "assistant",
            "content": [{"text": "hello"}],
            "tracking_id": "7d1f",
            "metadata": {"usage": usage, "metrics": {"latencyMs": 12}, "custom": {}},
        },
        {"role": "user", "content": [{"text": "go on"}]},
    ]
    value = raw({**INVOKE, "prompt": prompt})
    command = decode_command(value)
    assert isinstance(command, InvokeCommand)
    assert command.engine_input() == [{"role": m["role"], "content": m["content"]} for m in prompt]
    assert orjson.loads(encode(command)) == orjson.loads(value)


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"tracking_id": 7}, "prompt[0].tracking_id: must be a string, got a number"),
        ({"metadata": [1]}, "prompt[0].metadata: must be an object, got an array"),
        ({"trackingId": "x"}, "prompt[0].trackingId: is not a known field"),
    ],
)
def test_a_messages_other_keys_are_still_refused(extra: dict[str, Any], said: str) -> None:
    message = {"role": "user", "content": [{"text": "hi"}], **extra}
    error = refused(raw({**INVOKE, "prompt": [message]}))
    assert error.code == "invalid_command"
    assert said in error.reason


def test_optional_fields_that_were_absent_stay_absent_when_reencoded() -> None:
    command = decode_command(raw(INVOKE))
    assert orjson.loads(encode(command)) == INVOKE
    assert command.metadata == {} and command.limits is None and command.checkpointing is None


def test_a_command_without_schema_version_is_read_as_version_1() -> None:
    command = decode_command(raw({k: v for k, v in INVOKE.items() if k != "schema_version"}))
    assert isinstance(command, InvokeCommand)
    assert command.schema_version == 1


@pytest.mark.parametrize(
    ("version", "reason"),
    [
        (2, "Input should be 1"),
        (9223372036854775807, "Input should be 1"),
        # Past 2^63-1 the validator said "Unable to parse input string as an integer, exceeded
        # maximum size": the client sent a number, not a string. Up to 2^64-1 it is an integer
        # the wire keeps, so simply not 1.
        (9223372036854775808, "Input should be 1"),
        (2**64 - 1, "Input should be 1"),
        (2**64, OUT_OF_RANGE),
        (-(2**63) - 1, OUT_OF_RANGE),
    ],
)
def test_a_schema_version_other_than_1_is_refused_saying_why(version: int, reason: str) -> None:
    value = raw(INVOKE).replace(b'"schema_version":1', b'"schema_version":' + str(version).encode())
    assert refused(value).reason == f"schema_version: {reason}"


def test_resume_shapes_are_accepted() -> None:
    checkpoint = decode_command(raw(RESUME))
    assert isinstance(checkpoint, ResumeCommand)
    assert checkpoint.engine_input() == RESUME["resume"]
    answers = decode_command(raw({**RESUME, "resume": [ANSWER, ANSWER]}))
    assert isinstance(answers, ResumeCommand)
    assert answers.engine_input() == [ANSWER, ANSWER]


def test_unknown_checkpoint_keys_are_kept_for_the_engine() -> None:
    checkpoint = {**CHECKPOINT, "note": "from a newer client"}
    command = decode_command(
        raw({**RESUME, "resume": {"checkpointResume": {"checkpoint": checkpoint}}})
    )
    assert command.engine_input()["checkpointResume"]["checkpoint"] == checkpoint


@pytest.mark.parametrize(
    "prompt",
    [{"checkpointResume": {"checkpoint": CHECKPOINT}}, [ANSWER]],
    ids=["checkpoint", "answers"],
)
def test_an_invoke_with_a_resume_prompt_is_a_resume(prompt: Any) -> None:
    value = raw({**INVOKE, "prompt": prompt, "metadata": {"m": 1}})
    command = decode_command(value)
    assert isinstance(command, ResumeCommand)
    assert command.engine_input() == prompt
    assert (command.command_id, command.session_id, command.agent) == ("c-1", "s-1", "support")
    assert command.metadata == {"m": 1}
    expected = {**INVOKE, "type": "resume", "resume": prompt, "metadata": {"m": 1}}
    del expected["prompt"]
    assert orjson.loads(encode(command)) == expected


def test_cancel_is_read_from_the_control_topic() -> None:
    cancel = decode_control(
        raw({**CANCEL, "target_command_id": "c-1", "after_current_tools": True, "message": "stop"})
    )
    assert isinstance(cancel, CancelCommand)
    assert (cancel.target_command_id, cancel.after_current_tools, cancel.message) == (
        "c-1",
        True,
        "stop",
    )
    plain = decode_control(raw(CANCEL))
    assert plain.after_current_tools is False and plain.target_command_id is None


def test_delete_is_read_from_the_commands_topic_and_reencodes_unchanged() -> None:
    value = raw({**DELETE, "metadata": {"ticket": "T-9"}})
    command = decode_command(value, key=b"s-1")
    assert isinstance(command, DeleteCommand)
    assert (command.command_id, command.session_id, command.metadata) == (
        "c-4",
        "s-1",
        {"ticket": "T-9"},
    )
    assert orjson.loads(encode(command)) == orjson.loads(value)
    plain = decode_command(raw({k: v for k, v in DELETE.items() if k != "schema_version"}))
    assert orjson.loads(encode(plain)) == DELETE
    assert plain.metadata == {}


def test_a_delete_reaches_the_runtime_without_agent_or_input() -> None:
    value = raw({**DELETE, "metadata": {"m": 1}})
    record = InputRecord(Origin("cairn.commands", 0, 7), b"s-1", value, [], 0)
    parsed = parse_command(record)
    assert (parsed.type, parsed.command_id, parsed.session_id) == ("delete", "c-4", "s-1")
    assert (parsed.agent, parsed.input, parsed.metadata) == (None, None, {"m": 1})
    assert (parsed.checkpointing, parsed.limits, parsed.invocation_state) == (None, None, None)
    with pytest.raises(WireError, match="does not match the record key"):
        parse_command(InputRecord(Origin("cairn.commands", 0, 8), b"s-2", value, [], 0))


INVALID: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "unknown type",
        {**INVOKE, "type": "invok"},
        "invalid_command",
        "type: unknown message type 'invok'",
    ),
    (
        "cancel on commands",
        {**INVOKE, "type": "cancel"},
        "invalid_command",
        "'cancel' belongs on the control topic",
    ),
    (
        "delete with an agent",
        {**DELETE, "agent": "support"},
        "invalid_command",
        "agent: is not a known field",
    ),
    (
        "delete with a prompt",
        {**DELETE, "prompt": "hi"},
        "invalid_command",
        "prompt: is not a known field",
    ),
    (
        "delete with a wrapped checkpoint",
        {**DELETE, "resume": [{"checkpointResume": {"checkpoint": CHECKPOINT}}]},
        "invalid_command",
        "resume: is not a known field",
    ),
    (
        "delete without session_id",
        {k: v for k, v in DELETE.items() if k != "session_id"},
        "invalid_command",
        "session_id: is required",
    ),
    (
        "delete metadata not an object",
        {**DELETE, "metadata": "x"},
        "invalid_command",
        "metadata: must be an object, got a string",
    ),
    (
        "type not a string",
        {**INVOKE, "type": 3},
        "invalid_command",
        "type: must be a string, got a number",
    ),
    ("type null", {**INVOKE, "type": None}, "invalid_command", "type: must be a string, got null"),
    (
        "type missing",
        {k: v for k, v in INVOKE.items() if k != "type"},
        "invalid_command",
        "type: is required",
    ),
    (
        "future schema_version",
        {**INVOKE, "schema_version": 2},
        "invalid_command",
        "schema_version: Input should be 1",
    ),
    (
        "schema_version a double",
        {**INVOKE, "schema_version": 1.0},
        "invalid_command",
        "schema_version: must be an integer, got a number with a fraction or an exponent",
    ),
    (
        "no command_id",
        {k: v for k, v in INVOKE.items() if k != "command_id"},
        "invalid_command",
        "command_id: is required",
    ),
    (
        "empty session_id",
        {**INVOKE, "session_id": ""},
        "invalid_command",
        "session_id: String should have at least 1 character",
    ),
    (
        "no agent",
        {k: v for k, v in INVOKE.items() if k != "agent"},
        "invalid_command",
        "agent: is required",
    ),
    (
        "unknown field",
        {**INVOKE, "checkpointng": True},
        "invalid_command",
        "checkpointng: is not a known field",
    ),
    (
        "checkpointing as string",
        {**INVOKE, "checkpointing": "yes"},
        "invalid_command",
        "checkpointing: must be a boolean, got a string",
    ),
    (
        "limits wrong type",
        {**INVOKE, "limits": {"max_cycles": "3"}},
        "invalid_command",
        "limits.max_cycles: must be an integer, got a string",
    ),
    (
        "limits unknown key",
        {**INVOKE, "limits": {"max_turns": 3}},
        "invalid_command",
        "limits.max_turns: is not a known field",
    ),
    (
        "metadata not an object",
        {**INVOKE, "metadata": [1]},
        "invalid_command",
        "metadata: must be an object, got an array",
    ),
    (
        "empty prompt",
        {**INVOKE, "prompt": ""},
        "invalid_command",
        "prompt: String should have at least 1 character",
    ),
    (
        "prompt object",
        {**INVOKE, "prompt": {"text": "hi"}},
        "invalid_command",
        "prompt: must be text, a list of content blocks",
    ),
    (
        "block with two keys",
        {**INVOKE, "prompt": [{"text": "a", "image": {}}]},
        "invalid_command",
        "prompt[0]: a content block has exactly one key, got 2",
    ),
    (
        "text not a string",
        {**INVOKE, "prompt": [{"text": 1}]},
        "invalid_command",
        "prompt[0]: text must be a string, got a number",
    ),
    (
        "toolUse not an object",
        {**INVOKE, "prompt": [{"toolUse": []}]},
        "invalid_command",
        "prompt[0]: toolUse must be an object, got an array",
    ),
    (
        "toolResult id not a string",
        {
            **INVOKE,
            "prompt": [{"toolResult": {"toolUseId": 5, "status": "success", "content": []}}],
        },
        "invalid_command",
        "prompt[0]: toolResult.toolUseId must be a non-empty string, got a number",
    ),
    (
        "message bad role",
        {**INVOKE, "prompt": [{"role": "system", "content": [{"text": "x"}]}]},
        "invalid_command",
        "prompt[0].role: Input should be 'user' or 'assistant'",
    ),
    (
        "message empty content",
        {**INVOKE, "prompt": [{"role": "user", "content": []}]},
        "invalid_command",
        "prompt[0].content: List should have at least 1 item",
    ),
    (
        "toolUse without id",
        {
            **INVOKE,
            "prompt": [{"role": "assistant", "content": [{"toolUse": {"name": "x", "input": {}}}]}],
        },
        "invalid_command",
        "prompt[0].content[0]: toolUse is missing toolUseId",
    ),
    (
        "resume not a shape",
        {**RESUME, "resume": "go"},
        "invalid_command",
        'resume: must be {"checkpointResume"',
    ),
    (
        "resume empty list",
        {**RESUME, "resume": []},
        "invalid_command",
        'resume: must be {"checkpointResume"',
    ),
    (
        "resume extra outer key",
        {**RESUME, "resume": {"checkpointResume": {"checkpoint": CHECKPOINT}, "x": 1}},
        "checkpoint_incompatible",
        "resume.x: is not a known field",
    ),
    (
        "checkpoint missing",
        {**RESUME, "resume": {"checkpointResume": {}}},
        "checkpoint_incompatible",
        "resume.checkpointResume.checkpoint: is required",
    ),
    (
        "checkpoint version number",
        {
            **RESUME,
            "resume": {"checkpointResume": {"checkpoint": {**CHECKPOINT, "schema_version": 1.0}}},
        },
        "checkpoint_incompatible",
        "resume.checkpointResume.checkpoint.schema_version: Input should be '1.0'",
    ),
    (
        "checkpoint version 2.0",
        {
            **RESUME,
            "resume": {"checkpointResume": {"checkpoint": {**CHECKPOINT, "schema_version": "2.0"}}},
        },
        "checkpoint_incompatible",
        "schema_version: Input should be '1.0'",
    ),
    (
        "checkpoint version missing",
        {
            **RESUME,
            "resume": {
                "checkpointResume": {"checkpoint": {"position": "after_model", "cycle_index": 0}}
            },
        },
        "checkpoint_incompatible",
        "resume.checkpointResume.checkpoint.schema_version: is required",
    ),
    (
        "checkpoint bad position",
        {
            **RESUME,
            "resume": {
                "checkpointResume": {"checkpoint": {**CHECKPOINT, "position": "before_model"}}
            },
        },
        "checkpoint_incompatible",
        "checkpoint.position: Input should be 'after_model' or 'after_tools'",
    ),
    (
        "checkpoint negative index",
        {
            **RESUME,
            "resume": {"checkpointResume": {"checkpoint": {**CHECKPOINT, "cycle_index": -1}}},
        },
        "checkpoint_incompatible",
        "checkpoint.cycle_index: Input should be greater than or equal to 0",
    ),
    (
        "list-wrapped checkpoint",
        {**RESUME, "resume": [{"checkpointResume": {"checkpoint": CHECKPOINT}}]},
        "checkpoint_incompatible",
        "resume: a checkpoint resume is the object",
    ),
    (
        "list-wrapped checkpoint prompt",
        {**INVOKE, "prompt": [{"checkpointResume": {"checkpoint": CHECKPOINT}}]},
        "checkpoint_incompatible",
        "prompt: a checkpoint resume is the object",
    ),
    (
        "answer without id",
        {**RESUME, "resume": [{"interruptResponse": {"response": 1}}]},
        "invalid_command",
        "resume[0].interruptResponse.interruptId: is required",
    ),
    (
        "answer without response",
        {**RESUME, "resume": [{"interruptResponse": {"interruptId": "i"}}]},
        "invalid_command",
        "resume[0].interruptResponse.response: is required",
    ),
    (
        "answers mixed with text",
        {**RESUME, "resume": [ANSWER, {"text": "hi"}]},
        "invalid_command",
        "resume[1].interruptResponse: is required",
    ),
    (
        "answers mixed in a prompt",
        {**INVOKE, "prompt": [{"text": "hi"}, ANSWER]},
        "invalid_command",
        "prompt[0].interruptResponse: is required",
    ),
]


@pytest.mark.parametrize(("case", "value", "code", "reason"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_commands_are_refused_with_path_and_reason(
    case: str, value: dict[str, Any], code: str, reason: str
) -> None:
    error = refused(raw(value))
    assert reason in error.reason, case
    assert error.code == code
    assert error.issues and all(str(issue) in error.reason for issue in error.issues)


def test_ids_are_reported_when_they_could_be_read() -> None:
    error = refused(raw({**INVOKE, "prompt": 5}))
    assert (error.session_id, error.command_id, error.answerable) == ("s-1", "c-1", True)
    missing = refused(raw({**INVOKE, "command_id": 7}))
    assert (missing.session_id, missing.command_id, missing.answerable) == ("s-1", None, False)


@pytest.mark.parametrize("field", ["session_id", "command_id"])
def test_an_id_no_result_could_carry_leaves_the_command_unanswerable(field: str) -> None:
    longest = "x" * 256
    error = refused(raw({**INVOKE, field: longest, "prompt": 5}))
    assert error.answerable  # the longest valid id is read, so the refusal is answered
    too_long = refused(raw({**INVOKE, field: longest + "x"}))
    assert not too_long.answerable  # an error result could not carry it: dead-lettered
    assert f"{field}: String should have at most 256 characters" in too_long.reason


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"", "not UTF-8 JSON"),
        (b"{", "not UTF-8 JSON"),
        (b"\xff\xfe{}", "record value is not valid UTF-8: byte 0xff at offset 0 (invalid start"),
        (b'{"prompt": "a\xffb"}', "record value is not valid UTF-8: byte 0xff at offset 13"),
        (
            b'{"prompt": "\xe2\x82"}',
            "not valid UTF-8: byte 0xe2 at offset 12 (invalid continuation",
        ),
        (b'{"a": NaN}', "not UTF-8 JSON"),
        (b"[1, 2]", "must be a JSON object, got an array"),
        (b'"invoke"', "must be a JSON object, got a string"),
        (b"null", "must be a JSON object, got null"),
        (b"true", "must be a JSON object, got a boolean"),
        (b"1.5", "must be a JSON object, got a number"),
    ],
)
def test_non_json_values_are_refused_without_ids(value: bytes, reason: str) -> None:
    error = refused(value)
    assert reason in error.reason
    assert (error.session_id, error.command_id) == (None, None)


def test_oversize_values_are_refused_before_parsing() -> None:
    big = raw({**INVOKE, "prompt": "x" * DEFAULT_MAX_RECORD_BYTES})
    error = refused(big)
    assert f"{len(big)} bytes exceeds the limit of {DEFAULT_MAX_RECORD_BYTES}" in error.reason
    assert decode_command(raw(INVOKE), max_bytes=len(raw(INVOKE))).command_id == "c-1"
    assert "exceeds" in refused(raw(INVOKE), max_bytes=len(raw(INVOKE)) - 1).reason


def test_the_record_key_must_be_the_session_id() -> None:
    assert decode_command(raw(INVOKE), key=b"s-1").session_id == "s-1"
    error = refused(raw(INVOKE), key=b"s-2")
    assert "session_id: does not match the record key 's-2'" in error.reason
    assert error.answerable
    assert "the record has no key" in refused(raw(INVOKE), key=None).reason
    assert decode_command(raw(DELETE), key=b"s-1").session_id == "s-1"
    assert "does not match the record key 's-2'" in refused(raw(DELETE), key=b"s-2").reason
    assert "the record has no key" in refused(raw(DELETE), key=None).reason
    with pytest.raises(WireError, match="does not match the record key"):
        decode_control(raw(CANCEL), key=b"other")


@pytest.mark.parametrize(
    ("key", "shown"),
    [
        # Bytes that are not UTF-8 were shown as U+FFFD, which hid what the producer sent.
        (b"s-\xff\xfe1", r"'s-\xff\xfe1'"),
        (b"\xe2\x82s-1", r"'\xe2\x82s-1'"),
        ("sé-'1'\\".encode(), r"'sé-\'1\'\\'"),
        # Cut at 64 bytes, saying so, and never inside a character (é is two bytes).
        (b"k" * 100, "'" + "k" * 64 + "' (the first 64 of its 100 bytes)"),
        (b"k" * 63 + "é".encode(), "'" + "k" * 63 + "' (the first 63 of its 65 bytes)"),
        (b"k" * 63 + b"\xff\xff", "'" + "k" * 63 + r"\xff' (the first 64 of its 65 bytes)"),
    ],
)
def test_a_mismatched_key_is_shown_as_sent_with_bytes_that_are_not_utf8_escaped(
    key: bytes, shown: str
) -> None:
    error = refused(raw(INVOKE), key=key)
    assert error.reason == f"session_id: does not match the record key {shown}"
    assert error.answerable


def test_a_fork_keyed_by_its_source_is_told_it_belongs_to_the_new_session() -> None:
    fork = {
        "type": "fork",
        "schema_version": 1,
        "command_id": "c-9",
        "session_id": "s-new",
        "source_session_id": "s-1",
        "version": 1,
    }
    assert decode_command(raw(fork), key=b"s-new").session_id == "s-new"
    error = refused(raw(fork), key=b"s-1")
    assert error.answerable
    assert error.reason == (
        "session_id: does not match the record key 's-1', the fork's source_session_id: a fork "
        "is keyed by its session_id, the new session's id"
    )
    assert refused(raw(fork), key=b"s-2").reason.endswith("does not match the record key 's-2'")


def test_control_refuses_commands_and_commands_refuse_cancels() -> None:
    with pytest.raises(WireError, match="'invoke' belongs on the commands topic"):
        decode_control(raw(INVOKE))
    with pytest.raises(WireError, match="'delete' belongs on the commands topic"):
        decode_control(raw(DELETE))
    with pytest.raises(WireError, match=r"unknown_field: is not a known field"):
        decode_control(raw({**CANCEL, "unknown_field": 1}))
    with pytest.raises(WireError, match="target_command_id: String should have at least 1"):
        decode_control(raw({**CANCEL, "target_command_id": ""}))


def test_a_cancel_targeting_itself_is_refused_naming_its_own_id() -> None:
    with pytest.raises(WireError) as caught:
        decode_control(raw({**CANCEL, "target_command_id": CANCEL["command_id"]}))
    error = caught.value
    assert error.reason == "target_command_id: a cancel cannot target itself (its own command_id)"
    assert (error.code, error.command_id) == ("invalid_command", CANCEL["command_id"])


def test_many_issues_are_summarised_but_all_kept() -> None:
    prompt = [{"text": i} for i in range(20)]
    error = refused(raw({**INVOKE, "prompt": prompt}))
    assert len(error.issues) == 20
    assert error.reason.endswith("and 12 more")


def _chain(levels: int) -> dict[str, Any]:
    """``levels`` objects nested in one another."""
    node: dict[str, Any] = {}
    for _ in range(levels - 1):
        node = {"a": node}
    return node


def test_a_value_too_deep_for_the_parser_is_refused_as_too_deep_not_as_invalid_json() -> None:
    value = b'{"type": "invoke", "metadata": ' + b"[" * 2_000 + b"]" * 2_000 + b"}"
    error = refused(value)
    assert error.reason.startswith(
        "record value nests objects and arrays deeper than the 1,024 levels JSON is read to"
    )
    assert "not UTF-8 JSON" not in error.reason
    assert not error.answerable  # its ids cannot be read: dead-lettered


def test_commands_nested_too_deep_to_answer_are_refused_with_their_ids() -> None:
    # The command object itself is the first level.
    error = refused(json.dumps({**INVOKE, "metadata": _chain(MAX_DEPTH)}).encode())
    assert f"deeper than {MAX_DEPTH} levels" in error.reason
    assert error.answerable
    deepest = _chain(MAX_DEPTH - 1)
    command = decode_command(json.dumps({**INVOKE, "metadata": deepest}).encode())
    record = error_record(
        session_id="s-1", command_id="c-1", code="internal", message="x", metadata=command.metadata
    )
    assert orjson.loads(encode_result(record))["metadata"] == deepest


def test_metadata_integers_are_exact_from_minus_2_63_to_2_64_minus_1_and_doubles_beyond() -> None:
    """The documented range is orjson's: a signed 64-bit low end, an unsigned 64-bit high end."""
    edges = (
        b'{"lowest": -9223372036854775808, "highest": 18446744073709551615, '
        b'"below": -9223372036854775809, "above": 18446744073709551616}'
    )
    command = decode_command(raw(INVOKE)[:-1] + b', "metadata": ' + edges + b"}")
    exact = {"lowest": -(2**63), "highest": 2**64 - 1}
    nearest = {"below": float(-(2**63) - 1), "above": float(2**64)}
    assert command.metadata == {**exact, **nearest}
    assert [type(command.metadata[name]) for name in (*exact, *nearest)] == [int, int, float, float]
    echoed = error_record(
        session_id="s-1", command_id="c-1", code="internal", message="x", metadata=command.metadata
    )
    written = encode_result(echoed)
    assert b'"lowest":-9223372036854775808' in written
    assert b'"highest":18446744073709551615' in written
    assert orjson.loads(written)["metadata"] == {**exact, **nearest}


HISTORY: dict[str, Any] = {**DELETE, "type": "history"}
FORK: dict[str, Any] = {**DELETE, "type": "fork", "source_session_id": "s-0", "version": 1}
CHECKPOINT_AT = ("resume", "checkpointResume", "checkpoint")
INTEGER_FIELDS = [
    (FORK, ("version",)),
    (HISTORY, ("limit",)),
    (HISTORY, ("before",)),
    (INVOKE, ("schema_version",)),
    (INVOKE, ("limits", "max_cycles")),
    (INVOKE, ("limits", "max_tokens")),
    (RESUME, (*CHECKPOINT_AT, "cycle_index")),
]
"""Every integer a command holds, by the path to it."""
NULLABLE = {("before",), ("limits", "max_cycles"), ("limits", "max_tokens")}
_FIELD_IDS = [".".join(path) for _, path in INTEGER_FIELDS]


def _with(command: dict[str, Any], path: tuple[str, ...], number: bytes) -> bytes:
    """``command`` with ``number`` written, as given, at ``path`` (orjson would rewrite it)."""
    node = json.loads(json.dumps(command))
    parent = node
    for name in path[:-1]:
        parent = parent.setdefault(name, {})
    parent[path[-1]] = "<number>"
    return raw(node).replace(b'"<number>"', number)


@pytest.mark.parametrize(("command", "path"), INTEGER_FIELDS, ids=_FIELD_IDS)
@pytest.mark.parametrize("number", [b"18446744073709551616", b"-9223372036854775809"])
def test_an_integer_beyond_the_range_in_an_integer_field_is_refused_as_out_of_range(
    command: dict[str, Any], path: tuple[str, ...], number: bytes
) -> None:
    # orjson reads it as a double, which the field refused as "Input should be a valid integer":
    # the client sent an integer.
    error = refused(_with(command, path, number))
    assert error.reason == f"{'.'.join(path)}: {OUT_OF_RANGE}"
    assert "-9223372036854775808 to 18446744073709551615" in error.reason
    assert error.answerable


@pytest.mark.parametrize(("command", "path"), INTEGER_FIELDS, ids=_FIELD_IDS)
@pytest.mark.parametrize(
    ("number", "got"),
    [
        (b"3.0", "a number with a fraction or an exponent"),
        (b"3e0", "a number with a fraction or an exponent"),
        # A double past 2^64 with a fraction is no integer the wire could have kept.
        (b"18446744073709551616.0", "a number with a fraction or an exponent"),
        (b'"3"', "a string"),
        (b"true", "a boolean"),
        (b"null", "null"),
        (b"[3]", "an array"),
        (b'{"n": 3}', "an object"),
    ],
)
def test_an_integer_field_names_the_json_kind_it_got(
    command: dict[str, Any], path: tuple[str, ...], number: bytes, got: str
) -> None:
    if number == b"null" and path in NULLABLE:
        decode_command(_with(command, path, number))  # null means absent here
        return
    error = refused(_with(command, path, number))
    if path == ("schema_version",) and got in ("a string", "null", "an array", "an object"):
        # A literal: it says the value it takes, and what came instead.
        assert error.reason == f"schema_version: Input should be 1, got {got}"
    else:
        assert error.reason == f"{'.'.join(path)}: must be an integer, got {got}"


@pytest.mark.parametrize(
    ("command", "path", "value", "reason"),
    [
        (INVOKE, ("agent",), b"{}", "must be a string, got an object"),
        (INVOKE, ("session_id",), b"7", "must be a string, got a number"),
        (FORK, ("source_session_id",), b"null", "must be a string, got null"),
        (INVOKE, ("checkpointing",), b"1", "must be a boolean, got a number"),
        (INVOKE, ("limits",), b'"3"', "must be an object, got a string"),
        (INVOKE, ("limits",), b"[]", "must be an object, got an array"),
        (INVOKE, ("limits", "deadline_s"), b'"3"', "must be a number, got a string"),
        (INVOKE, ("limits", "deadline_s"), b"true", "must be a number, got a boolean"),
        (INVOKE, ("invocation_state",), b"5", "must be an object, got a number"),
        (INVOKE, ("metadata",), b"[]", "must be an object, got an array"),
        (DELETE, ("metadata",), b'"x"', "must be an object, got a string"),
        (CANCEL, ("message",), b"[]", "must be a string, got an array"),
        (CANCEL, ("after_current_tools",), b'"yes"', "must be a boolean, got a string"),
        (
            RESUME,
            (*CHECKPOINT_AT, "schema_version"),
            b"1.0",
            "Input should be '1.0', got a number",
        ),
        (
            RESUME,
            (*CHECKPOINT_AT, "position"),
            b"{}",
            "Input should be 'after_model' or 'after_tools', got an object",
        ),
    ],
)
def test_a_field_of_the_wrong_json_type_names_the_kind_it_got(
    command: dict[str, Any], path: tuple[str, ...], value: bytes, reason: str
) -> None:
    decode = decode_control if command is CANCEL else decode_command
    with pytest.raises(WireError) as caught:
        decode(_with(command, path, value))
    assert caught.value.reason == f"{'.'.join(path)}: {reason}"


@pytest.mark.parametrize(
    ("prompt", "reason"),
    [
        ([1], "prompt[0]: must be an object, got a number"),
        ([{"role": "user", "content": "x"}], "prompt[0].content: must be an array, got a string"),
        (
            [{"role": 1, "content": [{"text": "x"}]}],
            "prompt[0].role: Input should be 'user' or 'assistant', got a number",
        ),
    ],
)
def test_a_prompt_part_of_the_wrong_json_type_names_the_kind_it_got(
    prompt: Any, reason: str
) -> None:
    assert refused(raw({**INVOKE, "prompt": prompt})).reason == reason


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (
            {"interruptResponse": {"interruptId": 5, "response": 1}},
            "resume[0].interruptResponse.interruptId: must be a string, got a number",
        ),
        ({"interruptResponse": []}, "resume[0].interruptResponse: must be an object, got an array"),
    ],
)
def test_an_answer_of_the_wrong_json_type_names_the_kind_it_got(answer: Any, reason: str) -> None:
    assert refused(raw({**RESUME, "resume": [answer]})).reason == reason


def test_a_cancel_message_longer_than_its_limit_is_refused_at_once() -> None:
    # Kept, it would close the stopped command's result and push it past the record limit.
    decode_control(raw({**CANCEL, "message": "m" * 10_000}))
    with pytest.raises(WireError) as caught:
        decode_control(raw({**CANCEL, "message": "m" * 899_400}))
    error = caught.value
    assert error.reason == "message: String should have at most 10000 characters"
    assert (error.code, error.command_id) == ("invalid_command", CANCEL["command_id"])


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        (b'"metadata": {"big": 1e400}', "number is infinity when parsed as double"),
        (b'"metadata": {"s": "\\ud800"}', "surrogate"),
        # More digits than the interpreter turns into an int (sys.get_int_max_str_digits).
        (b'"metadata": {"big": ' + b"9" * 4_301 + b"}", "number is infinity"),
        (b'"limits": {"max_cycles": -' + b"9" * 20_000 + b"}", "number is infinity"),
    ],
)
def test_valid_json_the_parser_cannot_hold_is_refused_with_its_ids(extra: bytes, why: str) -> None:
    # JSON's grammar allows a number past a double's range and a lone surrogate escape; orjson
    # reads neither. The ids are readable, so the command is answered invalid_command, not
    # dead-lettered unanswered as a value that is not JSON would be.
    error = refused(raw(INVOKE)[:-1] + b", " + extra + b"}")
    assert error.answerable
    assert (error.session_id, error.command_id) == ("s-1", "c-1")
    assert why in error.reason
    assert error.reason.startswith("record value holds JSON that cannot be read")


def test_json_behind_a_byte_order_mark_is_refused_with_its_ids_and_named_for_it() -> None:
    error = refused(b"\xef\xbb\xbf" + raw(INVOKE))
    assert (error.answerable, error.session_id, error.command_id) == (True, "s-1", "c-1")
    assert error.reason == (
        "record value starts with a UTF-8 byte order mark (BOM); send the JSON without it"
    )


@pytest.mark.parametrize(
    "value",
    [
        # Ids that a result cannot carry: a lone surrogate is no Unicode text.
        b'{"type": "invoke", "command_id": "c-1", "session_id": "s-\\udc00", "n": 1e400}',
        # NaN and Infinity are not JSON at all.
        b'{"type": "invoke", "command_id": "c-1", "session_id": "s-1", "n": NaN}',
        b'{"type": "invoke", "command_id": "c-1", "session_id": "s-1", "n": -Infinity}',
        b"[1e400]",
    ],
)
def test_unreadable_json_without_answerable_ids_is_still_dead_lettered(value: bytes) -> None:
    assert not refused(value).answerable
