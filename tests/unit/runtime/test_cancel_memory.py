"""The cancel desk's bounded memories: the oldest entry goes first, nothing past the bound."""

from __future__ import annotations

from service.runtime.cancel_memory import AnsweredIds, Covers


def test_answered_ids_keep_the_newest_within_the_bound() -> None:
    ids = AnsweredIds(limit=2)
    for command_id in ("a", "b", "c"):
        ids.remember("s", command_id)
    assert [ids.knows("s", c) for c in ("a", "b", "c")] == [False, True, True]
    assert not ids.knows("other", "b")  # a session's ids are its own


def test_covers_keep_the_latest_time_and_end_only_with_the_delete_that_set_it() -> None:
    covers = Covers(limit=2)
    assert covers.until("s") == -1
    assert covers.cover("s", 100) == 100
    assert covers.cover("s", 50) == 100  # an older cancel covers nothing more
    covers.end_at("s", 50)
    assert covers.until("s") == 100
    covers.end_at("s", 100)
    assert covers.until("s") == -1
    for session_id in ("a", "b", "c"):
        covers.cover(session_id, 1)
    assert [covers.until(s) for s in ("a", "b", "c")] == [-1, 1, 1]
