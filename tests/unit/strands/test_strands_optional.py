"""Without the ``strands`` extra nothing of Cairn needs Strands: proven in a subprocess where
importing ``strands`` fails, as it does when the package is not installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent(
    """
    import importlib, pkgutil, sys
    from pathlib import Path

    class Blocked:
        def find_spec(self, name, path=None, target=None):
            if name == "strands" or name.startswith("strands."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Blocked())
    import service
    skipped = []
    for info in pkgutil.walk_packages(service.__path__, "service."):
        if info.name.startswith("service.strands_adapter"):
            skipped.append(info.name)
            continue
        importlib.import_module(info.name)

    from service.agent_config import load_agents
    path = Path(sys.argv[1]) / "agents.toml"
    path.write_text(
        '[[agents]]\\nname = "a"\\nmodel = "m"\\ntools = ["sample_tools:add"]\\n'
        '[agents.provider]\\ntype = "openai_compat"\\nbase_url = "http://127.0.0.1:9/v1"\\n'
    )
    agents = load_agents(path, {})
    assert list(agents["a"].tool_map) == ["add"], agents
    assert not [m for m in sys.modules if m == "strands" or m.startswith("strands.")]
    try:
        import service.strands_adapter
    except ModuleNotFoundError as exc:
        print("adapter:", exc)
    print("ok", ",".join(skipped))
    """
)


def test_cairn_loads_and_runs_agent_files_with_strands_blocked(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        cwd=ROOT,
        env={"PYTHONPATH": f"{ROOT}:{ROOT / 'tests/unit/agent_config'}", "PATH": "/usr/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "ok service.strands_adapter", "every other module was imported"
    assert lines[-2] == (
        "adapter: Strands agents and tools need the strands-agents package; install it with: "
        "pip install 'cairn[strands]'"
    )


def test_the_strands_extra_is_pinned_in_the_extra_and_the_dev_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    assert extras["strands"] == ["strands-agents>=1.62,<1.63"]
    assert "strands-agents>=1.62,<1.63" in extras["dev"]
    assert not any("strands" in d for d in project["dependencies"])
