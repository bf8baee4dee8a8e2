"""Session state as the changelog holds it, for tests that run runtime parts without Kafka."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import pytest

from service.runtime.work import Outcome
from service.sessions import store as store_module
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


def decodes_in(monkeypatch: pytest.MonkeyPatch) -> tuple[list[bool], threading.Event]:
    """Record, for each decode of a whole session from its table, whether it ran off the
    calling thread (the event loop's); a decode off it waits for the returned event first."""
    main = threading.get_ident()
    off_loop: list[bool] = []
    go = threading.Event()
    decode = store_module.decode_session

    def recorded(head: bytes, records: Any) -> Any:
        off_loop.append(threading.get_ident() != main)
        if off_loop[-1]:
            assert go.wait(10)
        return decode(head, records)

    monkeypatch.setattr(store_module, "decode_session", recorded)
    return off_loop, go
