"""Offset bookkeeping while records finish out of order."""

from __future__ import annotations

import pytest

from service.runtime.offsets import OffsetTracker


def test_position_is_the_lowest_unfinished_record() -> None:
    tracker = OffsetTracker(10)
    for offset in (10, 11, 13):
        tracker.received(offset)
    tracker.finished(11)
    tracker.finished(13)
    assert tracker.position == 10
    assert tracker.take_commit() is None
    tracker.finished(10)
    assert tracker.position == 14
    assert tracker.take_commit() == 14
    assert tracker.take_commit() is None


def test_refetched_records_are_not_new_and_going_back_is_refused() -> None:
    tracker = OffsetTracker(5)
    tracker.received(5)
    assert not tracker.accepts(5)
    assert tracker.accepts(6)
    with pytest.raises(ValueError, match="received after"):
        tracker.received(4)


def test_unfinished_counts_only_open_records() -> None:
    tracker = OffsetTracker(0)
    for offset in range(4):
        tracker.received(offset)
    tracker.finished(2)
    tracker.finished(99)
    assert tracker.unfinished == 3
