"""The one error of agent loading, and rendering of validation errors without input values.

Guarantee: messages name where a problem is (file, agent, field) and never echo a value, so a
secret that reached a wrong field cannot leak through an error.
"""

from __future__ import annotations

from pydantic import ValidationError


class AgentConfigError(ValueError):
    """A deployment's agents cannot be loaded; raised at start-up, never at the first command."""


def describe_validation(exc: ValidationError, prefix: str = "") -> str:
    lines = []
    for error in exc.errors(include_input=False, include_url=False):
        where = ".".join(str(part) for part in error["loc"])
        where = f"{prefix}.{where}" if prefix and where else (prefix or where or "(root)")
        lines.append(f"{where}: {error['msg']}")
    return "; ".join(lines)
