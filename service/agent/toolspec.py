"""Derive a tool's spec (name, description, JSON schema of its input) from a Python function.

The schema comes from the type hints (through a pydantic model, which also validates the input
at call time) and the descriptions from the docstring (Google ``Args:`` or ``:param x:`` style).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model

from service.agent.provider import ToolSpec

_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Notes?):\s*$"
)
_GOOGLE_ARG = re.compile(r"^\s*(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_ARG = re.compile(r"^\s*:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a docstring into its description and a map of parameter descriptions."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    for line in lines:
        sphinx = _SPHINX_ARG.match(line)
        if sphinx:
            current = sphinx.group(1)
            params[current] = sphinx.group(2).strip()
            section = "sphinx"
            continue
        header = _SECTION.match(line)
        if header:
            section = header.group(1)
            current = None
            continue
        if section in ("Args", "Arguments", "Parameters"):
            arg = _GOOGLE_ARG.match(line)
            if arg and line[: len(line) - len(line.lstrip())].count(" ") <= 4:
                current = arg.group(1).lstrip("*")
                params[current] = arg.group(3).strip()
            elif current and line.strip():
                params[current] = f"{params[current]} {line.strip()}".strip()
        elif section == "sphinx" and current and line.startswith((" ", "\t")) and line.strip():
            params[current] = f"{params[current]} {line.strip()}"
        elif section is None:
            description.append(line)
    return "\n".join(description).strip(), params


def _strip_titles(schema: Any) -> Any:
    """Drop pydantic's generated ``title`` keys; names inside ``properties`` are kept."""
    if isinstance(schema, list):
        return [_strip_titles(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title":
            continue
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {name: _strip_titles(sub) for name, sub in value.items()}
        else:
            out[key] = _strip_titles(value)
    return out


def build_input_model(
    fn: Callable[..., Any], name: str, skip: frozenset[str], param_docs: dict[str, str]
) -> type[BaseModel]:
    """A pydantic model of the function's parameters (minus ``skip``), for schema and checks."""
    try:
        hints = get_type_hints(fn)
    except (NameError, TypeError):
        hints = {}
    fields: dict[str, Any] = {}
    for pname, param in inspect.signature(fn).parameters.items():
        if pname in skip or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = hints.get(pname, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (annotation, Field(default, description=param_docs.get(pname) or pname))
    # Named as the reference names it, so validation errors read the same to the model.
    model_name = f"{getattr(fn, '__name__', name).capitalize()}Tool"
    model: type[BaseModel] = create_model(
        model_name, __config__=ConfigDict(arbitrary_types_allowed=True), **fields
    )
    return model


def spec_for(
    fn: Callable[..., Any], name: str, description: str | None, skip: frozenset[str]
) -> tuple[ToolSpec, type[BaseModel]]:
    doc_description, param_docs = parse_docstring(fn.__doc__)
    model = build_input_model(fn, name, skip, param_docs)
    schema = _strip_titles(model.model_json_schema())
    schema.setdefault("properties", {})
    schema.setdefault("required", [])
    return ToolSpec(
        name=name, description=description or doc_description or name, input_schema=schema
    ), model
