"""The settings table of docs/runtime.md states the defaults the code has."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from service.settings import Settings

DOC = Path(__file__).resolve().parents[3] / "docs" / "runtime.md"
ROW = re.compile(r"^\| `CAIRN_([A-Z_]+)` \| `?([^|`]+?)`? \|", re.MULTILINE)


def documented() -> list[tuple[str, str]]:
    return ROW.findall(DOC.read_text())


def default_of(name: str) -> Any:
    value: Any = Settings.model_construct()
    for part in name.lower().split("__"):
        value = getattr(value, part)
    return value


def test_the_table_names_the_settings_that_matter() -> None:
    names = {name for name, _ in documented()}
    assert {
        "GROUP__SESSION_TIMEOUT_MS",
        "GROUP__REBALANCE_TIMEOUT_MS",
        "RUNTIME__OFFSETS_EVERY_MS",
        "RUNTIME__REVOKE_GRACE_S",
    } <= names


@pytest.mark.parametrize(("name", "shown"), documented())
def test_a_documented_default_is_the_code_default(name: str, shown: str) -> None:
    actual = default_of(name)
    if actual is None:
        assert shown == "unset"
    elif isinstance(actual, bool):
        assert shown == str(actual).lower()  # as the environment variable is written
    elif isinstance(actual, float) and actual.is_integer():
        assert shown == str(int(actual))
    else:
        assert shown == str(actual)
