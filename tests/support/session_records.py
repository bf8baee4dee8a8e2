"""Session state as the changelog holds it, for tests that run runtime parts without Kafka."""

from __future__ import annotations

from collections.abc import Iterable

from service.runtime.work import Outcome
from service.sessions.store import SessionStore
from service.sessions.writer import SessionWriter

RECORD_MAX_BYTES = 1 << 20


def writer_for(store: SessionStore | None = None) -> SessionWriter:
    return SessionWriter(
        store if store is not None else SessionStore(), record_max_bytes=RECORD_MAX_BYTES
    )


def restored(outcomes: Iterable[Outcome]) -> SessionStore:
    """What a next owner restores: a fresh store holding the state records of ``outcomes``."""
    store = SessionStore()
    for outcome in outcomes:
        if outcome.state is not None:
            store.committed(
                [(key, value, outcome.state.event_seq, 0) for key, value in outcome.state.records],
                0,
                {},
            )
    store.flush()
    return store
