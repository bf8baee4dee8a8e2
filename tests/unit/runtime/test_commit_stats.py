"""The periodic commit stats: transactions counted once, whatever the shares they carry."""

from __future__ import annotations

import logging

import pytest

from service.runtime import commit_stats
from service.runtime.commit_stats import CommitReport, CommitStats


def _fields(line: str) -> dict[str, str]:
    head = line.split(" | ")[0]
    return dict(part.split("=<", 1) for part in head.replace(">", "").split(", "))


def test_shares_of_one_transaction_count_as_one_commit(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [100.0]
    monkeypatch.setattr(commit_stats.time, "monotonic", lambda: now[0])
    stats = CommitStats(interval_s=10.0)
    share = CommitReport(outcomes=4, records=12, results=4, state_bytes=300, states=3)
    for _ in range(3):  # three partitions' shares of one transaction
        stats(share)
    stats.transaction(0.010)
    stats(share)  # a fourth share, alone in a second transaction
    with caplog.at_level(logging.INFO, logger="service.runtime.commit_stats"):
        assert not caplog.records
        now[0] += 10.0  # the window is over at the next event, which it still counts
        stats.transaction(0.030)
    (line,) = [r.getMessage() for r in caplog.records if "commit stats" in r.getMessage()]
    fields = _fields(line)
    assert fields["commits"] == "2"
    assert fields["results"] == "16"
    assert fields["outcomes_per_commit"] == "8.0"
    assert fields["records_per_commit"] == "24.0"
    assert fields["commit_ms_avg"] == "20.00"
    assert fields["commit_ms_max"] == "30.00"
    assert fields["state_bytes_avg"] == "100"
