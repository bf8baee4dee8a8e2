"""Fixtures of the runtime integration tests: a fresh set of topics and a group per test."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support.runtime_harness import Cluster  # noqa: E402


@pytest.fixture
async def cluster(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    created = Cluster(kafka_bootstrap, tmp_path)
    await created.create_topics()
    yield created
    await created.delete_topics()
