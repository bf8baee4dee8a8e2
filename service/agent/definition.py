"""An agent definition: model, prompt, tools, executor, hooks, checkpointing default, limits,
context policy.

Definitions are built once per deployment and shared by every session; the engine never
mutates them. Tool and hook lookups are prepared at construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from service.agent.context import ContextPolicy
from service.agent.hooks import HookProvider, HookRegistry, build_registry
from service.agent.provider import ModelProvider, ToolSpec
from service.agent.tools import Tool
from service.agent.types import Limits

ExecutorKind = Literal["sequential", "concurrent"]


@dataclass
class AgentDefinition:
    name: str
    model: ModelProvider
    system_prompt: str | None = None
    tools: Sequence[Tool] = ()
    executor: ExecutorKind = "sequential"
    hooks: Sequence[HookProvider] = ()
    checkpointing: bool = False
    limits: Limits = field(default_factory=Limits)
    context: ContextPolicy = field(default_factory=ContextPolicy)
    """What the model sees of a long conversation (default: the last 40 messages)."""
    tool_map: dict[str, Tool] = field(init=False, repr=False, compare=False)
    tool_specs: list[ToolSpec] = field(init=False, repr=False, compare=False)
    hook_registry: HookRegistry = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.executor not in ("sequential", "concurrent"):
            raise ValueError(
                f"executor must be 'sequential' or 'concurrent', not {self.executor!r}"
            )
        if not isinstance(self.context, ContextPolicy):
            raise ValueError(  # noqa: TRY004 - a definition's problems are ValueErrors
                f"agent {self.name!r}: context must be a ContextPolicy, not {self.context!r}"
            )
        self.tool_map = {}
        for t in self.tools:
            if t.name in self.tool_map:
                raise ValueError(f"agent {self.name!r} has two tools named {t.name!r}")
            self.tool_map[t.name] = t
        self.tool_specs = [t.spec for t in self.tools]
        self.hook_registry = build_registry(self.hooks)
