"""docs/runtime.md names every setting the service reads and every metric it serves, so an
operator finds each there (a setting or metric added without its row fails here)."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

from service.observability.metrics import Metrics
from service.settings import Settings

RUNTIME_DOC = (Path(__file__).resolve().parents[2] / "docs" / "runtime.md").read_text()


def _variables(model: type[BaseModel], prefix: str) -> list[str]:
    names = []
    for name, field in model.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            names.extend(_variables(kind, f"{prefix}{name.upper()}__"))
        else:
            names.append(f"{prefix}{name.upper()}")
    return names


TABLE_ROWS = [line for line in RUNTIME_DOC.splitlines() if line.startswith("| `CAIRN_")]


def _documented(variable: str) -> bool:
    """In a row of a settings table: named whole, or as a `__FIELD` after its group's first
    variable, or (the fault settings, for tests only) by the row for its whole group."""
    group, _, field = variable.rpartition("__")
    for row in TABLE_ROWS:
        first = row.split("|")[1]
        if f"`{variable}`" in first or f"`{group}__*`" in first:
            return True
        if group and f"`{group}__" in first and f"`__{field}`" in first:
            return True
    return False


def test_every_setting_is_in_the_runtime_doc() -> None:
    variables = _variables(Settings, "CAIRN_")
    assert len(variables) > 40
    missing = [name for name in variables if not _documented(name)]
    assert missing == []


def test_every_metric_is_in_the_runtime_doc() -> None:
    served = {
        metric.name + ("_total" if metric.type == "counter" else "")
        for metric in Metrics().registry.collect()
    }
    assert len(served) > 10
    table = set(re.findall(r"^\| `(cairn_[a-z_]+)` \|", RUNTIME_DOC, flags=re.MULTILINE))
    assert served == table
