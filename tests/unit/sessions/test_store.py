"""The local session store: a cache rebuilt from changelog records in log order."""

from __future__ import annotations

from service.agent.state import SessionState
from service.sessions.codec import encode_state
from service.sessions.delivery import Delivery
from service.sessions.store import SessionStore, StoredSession, event_seq_header


def test_latest_record_wins_and_a_tombstone_deletes() -> None:
    store = SessionStore()
    first = SessionState(session_id="s1", agent="a")
    second = SessionState(session_id="s1", agent="b")
    store.load(b"s1", encode_state(first, Delivery(("c1",))), [event_seq_header(3)])
    store.load(b"s1", encode_state(second, Delivery(("c1", "c2"))), [event_seq_header(7)])
    store.load(b"s2", encode_state(SessionState(session_id="s2")), [])
    got = store.get("s1")
    assert got is not None
    assert got.state == second and got.delivery.applied == ("c1", "c2")
    assert got.event_seq == 7
    assert len(store) == 2
    store.load(b"s2", None, [])
    assert store.get("s2") is None
    assert len(store) == 1


def test_put_replaces_what_was_restored() -> None:
    store = SessionStore()
    store.load(b"s1", encode_state(SessionState(session_id="s1")), [])
    store.put("s1", StoredSession(SessionState(session_id="s1", agent="new"), event_seq=2))
    got = store.get("s1")
    assert got is not None
    assert (got.state.agent, got.event_seq) == ("new", 2)
    assert store.get("unknown") is None
