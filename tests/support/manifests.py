"""Reading the deployment files (Kubernetes manifests, Dockerfile, docs) for structural tests.

No cluster, Docker engine or kustomize runs in the tests, so these helpers read the files as the
tools would: YAML documents by kind and name, kustomize patches as the operations they list,
shell commands in Markdown code blocks as argument vectors.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
BASE = K8S / "base"
KEDA = K8S / "keda"
STRIMZI = K8S / "strimzi"
DOCKERFILE = ROOT / "Dockerfile"


def _setting_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> dict[str, tuple]:
    """``CAIRN_`` env name -> attribute path, derived from the settings model itself."""
    out: dict[str, tuple] = {}
    for name, field in model.model_fields.items():
        path = (*prefix, name)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out.update(_setting_paths(annotation, path))
        else:
            out["CAIRN_" + "__".join(p.upper() for p in path)] = path
    return out


SETTING_PATHS = _setting_paths(Settings)


def documents(path: Path) -> list[dict[str, Any]]:
    """The mappings of a YAML file (a JSON 6902 patch file, a list, yields none)."""
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


def folder_documents(folder: Path) -> list[dict[str, Any]]:
    """Every document of the folder's YAML files except its kustomization."""
    docs: list[dict[str, Any]] = []
    for path in sorted(folder.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs.extend(documents(path))
    return docs


def kustomization(folder: Path) -> dict[str, Any]:
    loaded = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def only(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d for d in docs if d.get("kind") == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def base_container(kind: str = "Deployment") -> dict[str, Any]:
    containers = only(folder_documents(BASE), kind)["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def configmap_data(folder: Path = BASE) -> dict[str, str]:
    data = only(folder_documents(folder), "ConfigMap")["data"]
    return {str(k): str(v) for k, v in data.items()}


def strimzi_env() -> dict[str, str]:
    """The settings of the Strimzi overlay: the base ConfigMap with the overlay's merged in, and
    the variables its Deployment patch sets itself (one from a Secret as ``secret:NAME/KEY``)."""
    env = {**configmap_data(BASE), **configmap_data(STRIMZI)}
    for _, patch in patches_for(STRIMZI, "Deployment"):
        for container in patch["spec"]["template"]["spec"]["containers"]:
            for variable in container.get("env", []):
                source = variable.get("valueFrom", {}).get("secretKeyRef")
                value = variable.get("value")
                if source is not None:
                    value = f"secret:{source['name']}/{source['key']}"
                env[variable["name"]] = str(value)
    return env


def settings_from(env: dict[str, str]) -> Settings:
    """The settings the service builds from exactly these ``CAIRN_`` variables."""
    unknown = {k for k in env if k.startswith("CAIRN_")} - set(SETTING_PATHS)
    assert not unknown, f"not settings: {sorted(unknown)}"
    nested: dict[str, Any] = {}
    for key, value in env.items():
        if not key.startswith("CAIRN_"):
            continue
        *groups, leaf = SETTING_PATHS[key]
        target = nested
        for group in groups:
            target = target.setdefault(group, {})
        target[leaf] = value
    return Settings.model_validate(nested)


def patches_for(folder: Path, kind: str) -> Iterator[tuple[dict[str, Any], Any]]:
    """(target, content) of each patch of the folder's kustomization aimed at ``kind``: content
    is the parsed patch (a list of JSON 6902 operations, or a strategic-merge document)."""
    for patch in kustomization(folder).get("patches", []):
        text = patch["patch"] if "patch" in patch else (folder / patch["path"]).read_text()
        content = yaml.safe_load(text)
        target = patch.get("target") or {
            "kind": content["kind"],
            "name": content["metadata"]["name"],
        }
        if target["kind"] == kind:
            yield target, content


_BLOCK = re.compile(r"^```[a-z]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def shell_commands(markdown: Path, program: str) -> list[list[str]]:
    """Every command of the document's code blocks that runs ``program`` (continuation lines
    joined, comments dropped), as argument vectors."""
    commands: list[list[str]] = []
    for block in _BLOCK.findall(markdown.read_text()):
        joined = re.sub(r"\\\n", " ", block)
        for line in joined.splitlines():
            argv = shlex.split(line, comments=True)
            if argv and argv[0] == program:
                commands.append(argv)
    return commands


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for keyword, rest in dockerfile_instructions():
        if keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((keyword, rest))
    return stages
