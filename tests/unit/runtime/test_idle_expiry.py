"""Idle expiry: an idle session is deleted with a ``session_expired`` event, and a stray copy of
a session another partition owns is deleted without one."""

from __future__ import annotations

import orjson

from service.agent.state import SessionState
from service.observability.metrics import Metrics
from service.runtime.idle_expiry import expire_idle
from service.runtime.work import Outcome
from service.sessions.delivery import Delivery
from tests.support.session_records import restored, writer_for

EVENTS = "t.events"


class _Idle:
    def busy(self, session_id: str) -> bool:
        return False


async def test_a_stray_copy_and_a_state_of_ids_only_are_deleted_without_an_event() -> None:
    first = writer_for()
    said = [{"role": "user", "content": [{"text": "hi"}]}]
    written = [
        Outcome(
            state=first.write(
                SessionState(session_id=sid, messages=list(said) if sid != "ids" else []),
                3,
                Delivery(applied=("c1",)),
            )
        )
        for sid in ("mine", "stray", "ids")
    ]
    store = restored(written)  # all last written at time 0: long idle
    submitted: list[Outcome] = []
    metrics = Metrics()
    await expire_idle(
        0.001,
        writer_for(store),
        submitted.append,
        _Idle(),  # type: ignore[arg-type]
        lambda: len(submitted) >= 3,
        EVENTS,
        metrics,
        owns=lambda session_id: session_id != "stray",
    )
    by_session = {outcome.state.session_id: outcome for outcome in submitted if outcome.state}
    assert set(by_session) == {"mine", "stray", "ids"}
    # Only remembered command ids (a refusal's, a delete's): no session whose end is announced.
    assert by_session["ids"].records == []
    for outcome in by_session.values():
        assert outcome.state is not None
        assert all(value is None for _, value in outcome.state.records)  # tombstones only
    [event] = by_session["mine"].records
    body = orjson.loads(event.value or b"")
    assert (event.topic, body["type"], body["session_id"]) == (EVENTS, "session_expired", "mine")
    assert by_session["stray"].records == []  # the session lives on its own partition
    assert metrics.registry.get_sample_value("cairn_sessions_expired_total") == 1
