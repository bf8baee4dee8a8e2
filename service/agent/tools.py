"""Tools: the ``@tool`` decorator, the :class:`Tool` seam and the context a tool receives.

A decorated function keeps working as a plain function; the engine calls :meth:`Tool.invoke`,
which validates the input against the spec derived from the function's type hints. Sync
functions run in a worker thread unless declared ``inline`` (then they must not block).
Each tool has a :class:`ToolPolicy`: its effect (may it run again after a crash?), a timeout,
and retries for idempotent tools.
"""

from __future__ import annotations

import abc
import asyncio
import copy
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, overload

from pydantic import BaseModel, ValidationError

from service.agent.cancel import CancelSignal
from service.agent.interrupts import InterruptBook, tool_call_id
from service.agent.outcomes import idempotency_key
from service.agent.provider import ToolSpec
from service.agent.results import (
    VALIDATION_PREFIX,
    ToolFailure,
    failure,
    input_not_object_text,
)
from service.agent.toolspec import spec_for

Effect = Literal["idempotent", "once"]
EFFECTS: tuple[Effect, ...] = get_args(Effect)


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """How the engine runs a tool.

    ``effect``: ``"idempotent"`` (the default) runs again after a crash, with the same
    idempotency key; ``"once"`` is recorded as started before it runs and is never run again
    without the caller's say (the ``tool_outcome_unknown`` interrupt). ``timeout_s``: the
    tool's cancel signal is set when it runs longer, and the model gets an error result.
    ``retries``: how many more times an idempotent tool runs after it raised or timed out,
    ``backoff_s`` seconds after the first failure, doubling after each.
    """

    effect: Effect = "idempotent"
    timeout_s: float | None = None
    retries: int = 0
    backoff_s: float = 1.0

    def __post_init__(self) -> None:
        if self.effect not in EFFECTS:
            raise ValueError(f"effect must be one of {list(EFFECTS)}, not {self.effect!r}")
        if self.timeout_s is not None and not (
            _number(self.timeout_s) and 0 < self.timeout_s < math.inf
        ):
            raise ValueError(f"timeout_s must be a positive number, not {self.timeout_s!r}")
        if not isinstance(self.retries, int) or isinstance(self.retries, bool) or self.retries < 0:
            raise ValueError(f"retries must be a whole number >= 0, not {self.retries!r}")
        if not (_number(self.backoff_s) and 0 <= self.backoff_s < math.inf):
            raise ValueError(f"backoff must be a number of seconds >= 0, not {self.backoff_s!r}")
        if self.effect == "once" and self.retries:
            raise ValueError("retries apply only to idempotent tools, not to effect='once'")

    def to_dict(self) -> dict[str, Any]:
        return {
            "effect": self.effect,
            "timeout_s": self.timeout_s,
            "retries": self.retries,
            "backoff_s": self.backoff_s,
        }


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


DEFAULT_POLICY = ToolPolicy()


@dataclass(slots=True)
class ToolContext:
    """What a running tool may know and do besides its input."""

    session_id: str
    tool_use_id: str
    cancel: CancelSignal
    invocation_state: dict[str, Any] = field(default_factory=dict)
    agent_state: dict[str, Any] = field(default_factory=dict)
    tool_use: dict[str, Any] = field(default_factory=dict)
    agent_name: str = ""
    _book: InterruptBook = field(default_factory=InterruptBook, repr=False)

    @property
    def idempotency_key(self) -> str:
        """Stable across replays of the same tool call: ``<session_id>:<toolUseId>``."""
        return idempotency_key(self.session_id, self.tool_use_id)

    def interrupt(self, name: str, reason: Any = None, response: Any = None) -> Any:
        """Return the human answer to ``name``; without one, pause the invocation here.

        The tool runs again from its start once answered, so code before this call must be
        safe to repeat.
        """
        return self._book.ask(tool_call_id(self.tool_use_id, name), name, reason, response)


class Tool(abc.ABC):
    """A callable the model may ask for; ``spec`` is what the model is told about it."""

    spec: ToolSpec
    policy: ToolPolicy = DEFAULT_POLICY

    @property
    def name(self) -> str:
        return self.spec.name

    def with_policy(self, policy: ToolPolicy) -> Tool:
        """The same tool run under ``policy`` (this one is left as it is)."""
        other = copy.copy(self)
        other.policy = policy
        return other

    @abc.abstractmethod
    async def invoke(self, input: Any, context: ToolContext) -> Any:
        """Run once and return the raw value (mapped to a toolResult by the engine).

        ``input`` is the toolUse's ``input`` as the model gave it (a toolUse without one is
        not run, as under the reference): meant to be an object, it may be any JSON value
        (``null``, a list, ...), which the tool refuses by raising.
        """


def _context_param(fn: Callable[..., Any]) -> str | None:
    try:
        hints = inspect.get_annotations(fn, eval_str=True)
    except (NameError, TypeError):
        hints = dict(getattr(fn, "__annotations__", {}))
    for pname in inspect.signature(fn).parameters:
        hint = hints.get(pname)
        if hint is ToolContext or hint == "ToolContext" or pname == "context":
            return pname
    return None


class FunctionTool(Tool):
    """A tool made from a plain (sync or async) function by :func:`tool`."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        inline: bool = False,
        policy: ToolPolicy = DEFAULT_POLICY,
    ) -> None:
        self.fn = fn
        self.policy = policy
        self.is_async = inspect.iscoroutinefunction(fn)
        self.inline = inline
        self.context_param = _context_param(fn)
        skip = frozenset({self.context_param} if self.context_param else ())
        self.spec, self._model = spec_for(fn, name or fn.__name__, description, skip)
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", self.spec.name)

    @property
    def input_model(self) -> type[BaseModel]:
        return self._model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    async def invoke(self, input: Any, context: ToolContext) -> Any:
        """Validate ``input`` against the function's parameters and call it.

        An input that is not an object is refused before validation, with
        :func:`~service.agent.results.input_not_object_text`; one that fails validation, with
        pydantic's error after the same ``Validation failed for input parameters: ``. Both
        raise ``ValueError``, so the model sees ``Error: <text>``.
        """
        if not isinstance(input, dict):
            # A ValueError, like a failed validation: its text reaches the model as it is.
            raise ValueError(input_not_object_text(self._model.__name__, input))  # noqa: TRY004
        try:
            kwargs = dict(self._model.model_validate(input).__dict__)
        except ValidationError as exc:
            # The reference's wording, so the model sees the same error text.
            raise ValueError(f"{VALIDATION_PREFIX}{exc}") from exc
        if self.context_param:
            kwargs[self.context_param] = context
        if self.is_async:
            return await self.fn(**kwargs)
        if self.inline:
            return _call(self.fn, kwargs)
        return await asyncio.to_thread(_call, self.fn, kwargs)


def _call(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """``fn(**kwargs)``, a ``StopIteration`` it raises made the ordinary failure it is: raised
    as it is, it could never reach the awaiting task (an asyncio future refuses it, and the
    await would never end, as under the reference) nor leave a coroutine (which turns it into a
    ``RuntimeError``)."""
    try:
        return fn(**kwargs)
    except StopIteration as exc:
        raise ToolFailure(*failure(exc)) from exc


@overload
def tool(fn: Callable[..., Any], /) -> FunctionTool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    inline: bool = False,
    effect: Effect = "idempotent",
    timeout_s: float | None = None,
    retries: int = 0,
    backoff: float = 1.0,
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    inline: bool = False,
    effect: Effect = "idempotent",
    timeout_s: float | None = None,
    retries: int = 0,
    backoff: float = 1.0,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Turn a function into a :class:`Tool`; usable bare (``@tool``) or with options (see
    :class:`ToolPolicy` for ``effect``, ``timeout_s``, ``retries`` and ``backoff``, seconds)."""
    policy = ToolPolicy(effect, timeout_s, retries, backoff)
    if fn is not None:
        return FunctionTool(fn, name=name, description=description, inline=inline, policy=policy)

    def wrap(f: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(f, name=name, description=description, inline=inline, policy=policy)

    return wrap
