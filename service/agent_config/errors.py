"""The one error of agent loading, and rendering of validation errors without input values.

Guarantee: messages name where a problem is (file, agent, field) and never echo a value, so a
secret that reached a wrong field cannot leak through an error.
"""

from __future__ import annotations

from pydantic import ValidationError


class AgentConfigError(ValueError):
    """A deployment's agents cannot be loaded; raised at start-up, never at the first command.

    ``problems`` holds every problem found, one sentence each; the message is them, one a line.
    """

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems: tuple[str, ...] = problems


def validation_problems(exc: ValidationError, prefix: str = "") -> list[str]:
    """One ``where: what`` line per validation error, without the offending values."""
    lines = []
    for error in exc.errors(include_input=False, include_url=False):
        where = ".".join(str(part) for part in error["loc"])
        where = f"{prefix}.{where}" if prefix and where else (prefix or where or "(root)")
        lines.append(f"{where}: {error['msg']}")
    return lines


def describe_validation(exc: ValidationError, prefix: str = "") -> str:
    return "; ".join(validation_problems(exc, prefix))
