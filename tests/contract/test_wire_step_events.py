"""Tool and checkpoint events are written without building their models: byte for byte what
the models write, and refused exactly where a model refuses."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from service.runtime.records import EVENT_MODELS, event_record
from service.wire.codec import encode, encode_event
from service.wire.events import step_event_json

ids = st.one_of(st.text(max_size=260), st.integers(), st.none(), st.just("a\x00b"))
names = st.one_of(st.text(max_size=20), st.integers(), st.none())
counts = st.one_of(st.integers(min_value=-2, max_value=5), st.booleans(), st.floats(), st.none())


def by_model(kind: str, sid: Any, cid: Any, seq: Any, version: Any, data: dict[str, Any]) -> Any:
    fields = {**data, "version": version} if version is not None else data
    try:
        return encode(EVENT_MODELS[kind](session_id=sid, command_id=cid, seq=seq, **fields))
    except ValidationError:
        return ValidationError
    except Exception as exc:  # the kind of failure is what is compared
        return type(exc)


def by_record(kind: str, sid: Any, cid: Any, seq: Any, version: Any, data: dict[str, Any]) -> Any:
    try:
        return event_record("events", sid, cid, seq, kind, data, version=version).value
    except ValidationError:
        return ValidationError
    except Exception as exc:
        return type(exc)


step_data = st.one_of(
    st.fixed_dictionaries({"tool_use_id": ids, "name": names}).map(lambda d: ("tool_started", d)),
    st.fixed_dictionaries(
        {"tool_use_id": ids, "name": names, "status": st.sampled_from(["success", "error", "x"])}
    ).map(lambda d: ("tool_finished", d)),
    st.fixed_dictionaries(
        {
            "position": st.sampled_from(["after_model", "after_tools", "before"]),
            "cycle_index": counts,
            "paused": st.one_of(st.booleans(), st.integers(0, 1)),
        }
    ).map(lambda d: ("checkpoint_reached", d)),
)


@settings(max_examples=400, deadline=None)
@given(
    step=step_data,
    sid=ids,
    cid=ids,
    seq=counts,
    version=st.one_of(st.none(), counts),
    extra=st.booleans(),
)
def test_a_step_event_is_what_its_model_writes_or_refuses(
    step: tuple[str, dict[str, Any]], sid: Any, cid: Any, seq: Any, version: Any, extra: bool
) -> None:
    kind, data = step
    if extra:
        data = {**data, "other": 1}
    assert by_record(kind, sid, cid, seq, version, data) == by_model(
        kind, sid, cid, seq, version, data
    )


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        ("tool_started", {"tool_use_id": "t1", "name": "echo"}),
        ("tool_finished", {"tool_use_id": "t1", "name": "echo", "status": "interrupted"}),
        ("checkpoint_reached", {"position": "after_tools", "cycle_index": 2, "paused": False}),
    ],
)
def test_the_engine_step_events_take_the_short_path(kind: str, data: dict[str, Any]) -> None:
    value = step_event_json(kind, "s1", "c1", 4, 7, data)
    assert value is not None
    model = EVENT_MODELS[kind](session_id="s1", command_id="c1", seq=4, version=7, **data)
    assert value == encode_event(model)
    assert step_event_json("model_message", "s1", "c1", 4, 7, data) is None
