"""The shape of an agents file (TOML or YAML): a list of agents with provider, tools and limits.

Guarantee: a validated :class:`DeploymentSpec` has unique agent names and holds no secret: keys
are named by environment variable (``api_key_env``), never written in the file.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ProviderKind = Literal["openai_compat", "anthropic"]


class LimitsSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_cycles: int | None = Field(default=None, gt=0)
    max_tokens: int | None = Field(default=None, gt=0)
    deadline_s: float | None = Field(default=None, gt=0)


class ProviderSpec(BaseModel):
    """``type`` picks the provider; the other keys are its options (checked when it is built)."""

    model_config = ConfigDict(extra="allow")

    type: ProviderKind
    api_key_env: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _no_inline_secrets(self) -> ProviderSpec:
        extra = self.model_extra or {}
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


class AgentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=128)
    model: str = Field(min_length=1)
    provider: ProviderSpec
    system_prompt: str | None = None
    tools: list[str] = Field(default_factory=list)
    hooks: list[str] = Field(default_factory=list)
    executor: Literal["sequential", "concurrent"] = "sequential"
    checkpointing: bool = False
    limits: LimitsSpec = Field(default_factory=LimitsSpec)

    @field_validator("tools", "hooks")
    @classmethod
    def _import_paths(cls, paths: list[str]) -> list[str]:
        for path in paths:
            module, sep, attribute = path.partition(":")
            if not (module and sep and attribute):
                raise ValueError(f"{path!r} is not an import path 'package.module:attribute'")
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
