"""Property: the applied command ids of a session, however they were added (one at a time, several
at once, past the kept window, from a record that holds one id twice), answer ``answered`` exactly
as a scan of the list would, in every value made along the way."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from service.sessions.delivery import APPLIED_KEPT, Delivery

POOL = [f"cmd-{i}" for i in range(APPLIED_KEPT + 40)]
"""More ids than a session keeps, so the oldest are dropped and may come back."""


def _reference(applied: list[str], command_ids: list[str]) -> list[str]:
    """What remembering ``command_ids`` means: each once, the oldest forgotten past the limit."""
    out = list(applied)
    for command_id in command_ids:
        if command_id not in out:
            out.append(command_id)
    return out[-APPLIED_KEPT:]


_ids = st.sampled_from(POOL)
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("applying"), st.lists(_ids, max_size=4)),
        st.tuples(st.just("finished"), _ids),
        st.tuples(st.just("started"), st.integers(0, 10**6)),
        st.tuples(st.just("covering"), st.integers(-1, 10**6)),
        st.tuples(
            st.just("many"), st.lists(_ids, min_size=APPLIED_KEPT, max_size=APPLIED_KEPT + 5)
        ),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(start=st.lists(_ids, max_size=8), steps=_steps)
def test_answered_agrees_with_the_list_in_every_value_made(
    start: list[str], steps: list[tuple[str, Any]]
) -> None:
    # Loaded from a record: its list as written, an id held twice included.
    delivery = Delivery.from_record({"applied_commands": start})
    expected = list(start)
    made = [(delivery, list(expected))]
    for op, arg in steps:
        if op in ("applying", "many"):
            delivery, expected = delivery.applying(*arg), _reference(expected, arg)
        elif op == "finished":
            delivery, expected = delivery.finished(arg), _reference(expected, [arg])
            assert delivery.inflight_published_ms is None
        elif op == "started":
            delivery = delivery.started(arg)
            assert delivery.inflight_published_ms == arg
        else:
            delivery = delivery.covering(arg)
        assert list(delivery.applied) == expected
        made.append((delivery, list(expected)))
    # Asked only now, so a value's set made early is checked after its successors were made.
    for value, ids in made:
        for command_id in POOL[:20] + POOL[-20:] + ids[:3]:
            assert value.answered(command_id) == (command_id in ids), command_id


def test_remembering_an_id_already_there_changes_nothing() -> None:
    delivery = Delivery(applied=("a", "b"), inflight_published_ms=5)
    assert delivery.applying("b") is delivery
    assert delivery.finished("a") == Delivery(applied=("a", "b"))


def test_a_list_holding_an_id_twice_forgets_what_falls_out_of_the_window() -> None:
    loaded = Delivery.from_record({"applied_commands": ["a", "b", "a"]})
    assert loaded.answered("a") and loaded.answered("b")
    fresh = [f"n{i}" for i in range(APPLIED_KEPT - 1)]
    after = loaded.applying(*fresh)
    assert after.applied == ("a", *fresh)
    assert after.answered("a") and not after.answered("b")
    assert not after.applying("z").answered("a")


def test_a_record_at_or_before_the_newest_answered_is_recognised_and_a_new_topics_is_not() -> None:
    delivery = Delivery().finished("c9").through((9, 1_000, None))
    assert delivery.read_before(9, 1_000) and delivery.read_before(3, 900)
    assert not delivery.read_before(10, 1_001)
    # A topic made anew starts its offsets again, with records published later.
    assert not delivery.read_before(0, 5_000)
    # A record without a publication time is never recognised by position.
    assert not delivery.read_before(3, -1)
    # Every value made from it keeps the position; none given changes nothing.
    later = delivery.applying("x").finished("y").started(5).covering(7)
    assert later.answered_through == (9, 1_000)
    assert later.through(None) is later


def test_within_a_known_log_the_offset_alone_decides_and_another_log_is_never_read_before() -> None:
    delivery = Delivery().finished("c9").through((9, 1_000, "T1:0"))
    # The same log: at or before the newest answered, whatever the record's publication time
    # (a producer whose clock runs ahead), and without one.
    assert delivery.read_before(9, 1_000, "T1:0") and delivery.read_before(3, 5_000, "T1:0")
    assert delivery.read_before(3, -1, "T1:0")
    assert not delivery.read_before(10, 900, "T1:0")
    # The topic deleted and created again, published with an older time: not answered.
    assert not delivery.read_before(0, 900, "T2:0")
    # Another partition of the topic (its partitions added to): not answered.
    assert not delivery.read_before(3, 900, "T1:1")
    # The owner knows no log (a broker without topic ids): the publication time decides.
    assert delivery.read_before(3, 900) and not delivery.read_before(3, 5_000)
    # A state from before logs were recorded: the same.
    old = Delivery().through((9, 1_000, None))
    assert old.read_before(3, 900, "T2:0") and not old.read_before(3, 5_000, "T2:0")
    # The log goes with the position into the record, and back; values made from it keep it.
    later = delivery.applying("x").finished("y").started(5).covering(7).targeting("z")
    assert later.answered_log == "T1:0"
    fields = later.record_fields()
    assert (fields["answered_through"], fields["answered_log"]) == ([9, 1_000], "T1:0")
    assert Delivery.from_record(fields).answered_log == "T1:0"
    assert "answered_log" not in old.record_fields()
    # A newer answer in a log not known drops the old log with the old offset.
    assert delivery.through((2, 2_000, None)).answered_log is None
    # The offset an owner of a log goes by: only one of its own log, or of a log not known.
    assert delivery.through_in("T1:0") == 9 and delivery.through_in(None) == 9
    assert delivery.through_in("T2:0") is None and Delivery().through_in("T1:0") is None
    assert old.through_in("T2:0") == 9


def test_a_cancel_target_is_kept_until_answered_and_written_only_when_set() -> None:
    assert "cancel_targets" not in Delivery().record_fields()
    waiting = Delivery().targeting("t").targeting("t").targeting("u")
    assert waiting.targets == ("t", "u")
    assert Delivery.from_record(waiting.record_fields()).targets == ("t", "u")
    assert waiting.applying("t").targets == ("u",)
    assert waiting.finished("u").covering(5).targets == ("t",)
