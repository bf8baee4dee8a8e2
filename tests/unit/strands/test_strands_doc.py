"""docs/from-strands.md shows the example file as it is, and its registry and agent file load."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.agent_config import AgentConfigError, load_agents
from service.strands_adapter.tools import StrandsTool

REPO = Path(__file__).resolve().parents[3]
DOC = (REPO / "docs" / "from-strands.md").read_text(encoding="utf-8")
EXAMPLES = REPO / "docs" / "examples"
ENV = {"OPENAI_API_KEY": "sk-doc"}


@pytest.fixture(autouse=True)
def _examples_importable() -> Iterator[None]:
    sys.path.insert(0, str(EXAMPLES))
    yield
    sys.path.remove(str(EXAMPLES))


def block(language: str) -> str:
    [found] = re.findall(rf"```{language}\n(.*?)```", DOC, flags=re.S)
    return found


def test_the_page_shows_the_example_file_as_it_is() -> None:
    example = (EXAMPLES / "strands_shop.py").read_text(encoding="utf-8")
    assert block("python") in example


def test_the_example_registry_loads_as_the_page_says(monkeypatch: pytest.MonkeyPatch) -> None:
    # A registry reads the process environment, as under `cairn serve`.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-doc")
    agents = load_agents("strands_shop:registry", {})
    shop = agents["shop"]
    assert [t.name for t in shop.tools] == ["lookup_order", "refund"]
    assert all(isinstance(t, StrandsTool) for t in shop.tools)
    assert shop.context.describe() == {"strategy": "sliding_window", "max_messages": 30}
    assert "sliding_window(30)" in DOC
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(AgentConfigError, match="'OPENAI_API_KEY'"):
        load_agents("strands_shop:registry", {})


def test_the_agent_file_of_the_page_loads(tmp_path: Path) -> None:
    path = tmp_path / "shop.toml"
    path.write_text(block("toml"), encoding="utf-8")
    shop = load_agents(path, ENV)["shop"]
    assert shop.tool_map["refund"].policy.effect == "once"
    assert isinstance(shop.tool_map["lookup_order"], StrandsTool)
