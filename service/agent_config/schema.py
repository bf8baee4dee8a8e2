"""The shape of an agents file (TOML or YAML): a list of agents with provider, tools and limits.

Guarantee: a validated :class:`DeploymentSpec` has unique agent names and holds no secret: keys
are named by environment variable (``api_key_env``), never written in the file (Bedrock's
come from the AWS chain). Like provider
options, a tool table's options are checked when the agent is built (:class:`ToolEntry`), so
that their problems name the agent and the tool.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from service.agent.context import Strategy
from service.agent.tools import Effect

ProviderKind = Literal["openai_compat", "anthropic", "bedrock"]

_CREDENTIAL_WORDS = ("secret", "access_key", "session_token", "password", "credential")
"""Parts of a Bedrock option name that would hold an AWS credential, which a file never carries."""


class LimitsSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_cycles: int | None = Field(default=None, gt=0)
    max_tokens: int | None = Field(default=None, gt=0)
    deadline_s: float | None = Field(default=None, gt=0)


class ContextSpec(BaseModel):
    """``context = { strategy = "summarize", max_messages = 40, keep_recent = 10,
    summarizer = "other-agent" }``; only the keys written count, the rest are the defaults
    of :class:`~service.agent.context.ContextPolicy`, which checks the values."""

    model_config = ConfigDict(extra="forbid", strict=True)

    strategy: Strategy = "sliding_window"
    max_messages: int | None = None
    keep_recent: int | None = None
    summarizer: str | None = Field(default=None, min_length=1)
    """The name of another agent of the file whose model and system prompt write summaries."""


class ProviderSpec(BaseModel):
    """``type`` picks the provider; the other keys are its options (checked when it is built)."""

    model_config = ConfigDict(extra="allow")

    type: ProviderKind
    api_key_env: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _no_inline_secrets(self) -> ProviderSpec:
        extra = self.model_extra or {}
        if self.type == "bedrock":
            written = [
                key
                for key in extra
                if key == "api_key" or any(word in key.lower() for word in _CREDENTIAL_WORDS)
            ]
            if written:
                raise ValueError(
                    f"credentials must not be written in the file ({', '.join(sorted(written))}); "
                    "bedrock takes them from the standard AWS chain (environment, profile, "
                    "web identity, instance or container role)"
                )
        if "api_key" in extra:
            raise ValueError(
                "api_key must not be written in the file; name an environment variable "
                "with api_key_env"
            )
        if "model_id" in extra:
            raise ValueError("set the model with the agent's 'model' key, not provider.model_id")
        return self

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ToolEntry(BaseModel):
    """A tool given as a table: its import path, and options over the tool's own policy.

    Only the options written count, each replacing that one field of the imported tool's
    :class:`~service.agent.tools.ToolPolicy`; which values are valid is the policy's to say.
    Types are strict (``timeout_s = "30"`` is refused), so only numbers and a known effect
    reach the policy's checks, whose messages may quote them.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    path: str
    effect: Effect | None = None
    timeout_s: float | None = None
    retries: int | None = None
    backoff: float | None = None

    def policy_options(self) -> dict[str, Any]:
        """The options written, by ToolPolicy field name (``backoff`` is ``backoff_s``)."""
        options = self.model_dump(exclude_unset=True, exclude={"path"})
        if "backoff" in options:
            options["backoff_s"] = options.pop("backoff")
        return options


def _check_import_path(path: str) -> None:
    module, sep, attribute = path.partition(":")
    if not (module and sep and attribute):
        raise ValueError(f"{path!r} is not an import path 'package.module:attribute'")


def _check_tool_path(path: str) -> None:
    """An import path, or a module's dotted name (a module of Strands tools)."""
    if ":" in path or not path or not all(part.isidentifier() for part in path.split(".")):
        _check_import_path(path)


class AgentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=128)
    model: str = Field(min_length=1)
    provider: ProviderSpec
    system_prompt: str | None = None
    tools: list[str | dict[str, Any]] = Field(default_factory=list)
    hooks: list[str] = Field(default_factory=list)
    executor: Literal["sequential", "concurrent"] = "sequential"
    checkpointing: bool = False
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    context: ContextSpec = Field(default_factory=ContextSpec)

    @field_validator("context", mode="before")
    @classmethod
    def _context_by_name(cls, value: Any) -> Any:
        # ``context = "none"`` is short for ``context = { strategy = "none" }``.
        return {"strategy": value} if isinstance(value, str) else value

    @field_validator("tools", mode="before")
    @classmethod
    def _tool_entries(cls, entries: Any) -> Any:
        # Said once here, rather than as one error per member of the union.
        for index, entry in enumerate(entries if isinstance(entries, list) else []):
            if not isinstance(entry, str | dict):
                raise ValueError(  # noqa: TRY004 - pydantic reports only a ValueError
                    f"entry {index} is neither an import path 'package.module:attribute' "
                    "nor a table with a 'path'"
                )
        return entries

    @field_validator("tools")
    @classmethod
    def _tool_paths(cls, entries: list[str | dict[str, Any]]) -> list[str | dict[str, Any]]:
        for entry in entries:
            path = entry.get("path") if isinstance(entry, dict) else entry
            if isinstance(path, str):
                _check_tool_path(path)
        return entries

    @field_validator("hooks")
    @classmethod
    def _hook_paths(cls, paths: list[str]) -> list[str]:
        for path in paths:
            _check_import_path(path)
        return paths


def duplicate_names(names: Iterable[str]) -> list[str]:
    """One problem per name used more than once, in order of first repetition."""
    seen: set[str] = set()
    twice: list[str] = []
    for name in names:
        if name in seen and name not in twice:
            twice.append(name)
        seen.add(name)
    return [f"agent name {name!r} is used twice" for name in twice]


class DeploymentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agents: list[AgentSpec] = Field(min_length=1)

    @field_validator("agents")
    @classmethod
    def _unique_names(cls, agents: list[AgentSpec]) -> list[AgentSpec]:
        # A field check runs whenever every agent is valid, even beside other top-level errors.
        problems = duplicate_names(agent.name for agent in agents)
        if problems:
            raise ValueError("; ".join(problems))
        return agents
