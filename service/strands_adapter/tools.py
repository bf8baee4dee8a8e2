"""Strands tools (``@strands.tool`` functions, tool modules with ``TOOL_SPEC``) run as Cairn tools.

Guarantees: the model is told the tool's own Strands spec, and the tool runs through its own
``stream``, so Strands validates the input and shapes the result as it does under a Strands
agent. ``tool_context.interrupt(name, reason=...)`` pauses the invocation with a Cairn interrupt
whose id is the one Strands gives it (``v1:tool_call:<toolUseId>:<uuid5(name)>``); on the resume
that answers it, the tool runs again from its start and the same call returns the answer. An
exception the tool raised is raised again, so Cairn's retries and error text apply; one that
escaped the tool's own handling is raised with the reference's text for it
(:func:`~service.agent.results.escaped_failure`).

What the tool sees of its context: ``tool_use`` and ``invocation_state`` (the invocation's,
shared by its tools, with ``"agent"`` added while the tool runs, as Strands does),
``cancel_signal`` (a ``threading.Event`` set by an immediate cancel), and ``agent``, a stand-in
:class:`AgentView`: ``name``, ``state`` (``get``/``set``/``delete`` on the session's agent
state) and ``cancel_signal``; anything else of a Strands agent is refused with an
``AttributeError`` that says so.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from strands.interrupt import Interrupt as StrandsInterrupt
from strands.interrupt import InterruptException
from strands.tools.loader import load_tools_from_module
from strands.tools.tools import PythonAgentTool
from strands.types._events import ToolInterruptEvent
from strands.types.events import ToolResultEvent
from strands.types.tools import AgentTool
from strands.types.tools import ToolContext as StrandsToolContext

from service.agent.cancel import CancelSignal
from service.agent.interrupts import InterruptSignal
from service.agent.provider import ToolSpec
from service.agent.results import ToolFailure, escaped_failure, failure
from service.agent.tools import Tool, ToolContext
from service.agent.types import Interrupt


class AgentStateView:
    """Strands' ``agent.state`` API over the session's agent state (stored with the session).

    As under Strands: values go in and come out as copies (changing what ``get`` returned
    changes nothing stored); a key that is not a non-blank string, or a value that is not
    JSON, is refused with ``ValueError`` by the call that gives it.
    """

    __slots__ = ("_state",)

    def __init__(self, state: dict[str, Any]) -> None:
        self._state = state

    def get(self, key: str | None = None) -> Any:
        return copy.deepcopy(self._state if key is None else self._state.get(key))

    def set(self, key: str, value: Any) -> None:
        _check_key(key)
        try:
            json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"Value is not JSON serializable: {type(value).__name__}. Only JSON-compatible "
                "types (str, int, float, bool, list, dict, None) are allowed."
            ) from exc
        self._state[key] = copy.deepcopy(value)

    def delete(self, key: str) -> None:
        _check_key(key)
        self._state.pop(key, None)


def _check_key(key: Any) -> None:
    if key is None:
        raise ValueError("Key cannot be None")
    if not isinstance(key, str):
        raise ValueError("Key must be a string")  # noqa: TRY004 - ValueError, as under Strands
    if not key.strip():
        raise ValueError("Key cannot be empty")


class AgentView:
    """The stand-in for ``tool_context.agent``: what Cairn can offer of a Strands agent."""

    def __init__(self, context: ToolContext, cancel_signal: threading.Event) -> None:
        self.name = context.agent_name
        self.state = AgentStateView(context.agent_state)
        self.cancel_signal = cancel_signal

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"under Cairn, tool_context.agent is a stand-in offering name, state and "
            f"cancel_signal; it has no {name!r}"
        )


@dataclass
class CairnToolContext(StrandsToolContext[Any]):
    """A Strands tool context whose interrupts are Cairn's (same ids, answers from the resume)."""

    cairn: ToolContext | None = field(default=None, repr=False, compare=False)

    def interrupt(self, name: str, reason: Any = None, response: Any = None) -> Any:
        if self.cairn is None:
            raise RuntimeError("this tool context is not bound to a Cairn tool call")
        try:
            return self.cairn.interrupt(name, reason, response)
        except InterruptSignal as signal:
            # Strands' own exception, so the tool's ``stream`` ends with an interrupt event.
            raise InterruptException(StrandsInterrupt(signal.interrupt.id, name, reason)) from None


class StrandsTool(Tool):
    """One Strands ``AgentTool`` run by Cairn's executor."""

    def __init__(self, agent_tool: AgentTool) -> None:
        spec = agent_tool.tool_spec
        schema = spec.get("inputSchema") or {}
        json_schema = schema.get("json", schema) if isinstance(schema, dict) else {}
        self.strands_tool = _without_stop_iteration(agent_tool)
        self.spec = ToolSpec(
            name=spec["name"],
            description=spec.get("description") or spec["name"],
            input_schema=dict(json_schema),
        )

    async def invoke(self, input: Any, context: ToolContext) -> Any:
        cancel_signal = threading.Event()
        mirror = asyncio.create_task(_mirror_cancel(context.cancel, cancel_signal))
        try:
            return await self._run(input, context, cancel_signal)
        finally:
            mirror.cancel()

    async def _run(self, input: Any, context: ToolContext, cancel_signal: threading.Event) -> Any:
        tool_use: Any = {"toolUseId": context.tool_use_id, "name": self.name, "input": input}
        agent = AgentView(context, cancel_signal)
        # The invocation's own dict, as under Strands: what a tool puts there, the tools after
        # it in the invocation see. "agent" is there while the tool runs.
        state = context.invocation_state
        state["agent"] = agent
        strands_context = CairnToolContext(
            tool_use=tool_use,
            agent=agent,
            invocation_state=state,
            cancel_signal=cancel_signal,
            cairn=context,
        )
        final: ToolResultEvent | None = None
        asked: StrandsInterrupt | None = None
        try:
            async for event in self.strands_tool.stream(
                tool_use, state, _tool_context=strands_context
            ):
                if isinstance(event, ToolInterruptEvent):
                    asked = event.interrupts[0]
                    break
                if isinstance(event, ToolResultEvent):
                    final = event
        except ToolFailure:
            raise
        except Exception as exc:
            # Escaped the tool's own handling (a module tool's failure, or what an exception's
            # ``__str__`` raised): told as the reference's executor tells it.
            raise ToolFailure(*escaped_failure(exc)) from exc
        finally:
            if state.get("agent") is agent:
                del state["agent"]
        if asked is not None:
            raise InterruptSignal(Interrupt(id=asked.id, name=asked.name, reason=asked.reason))
        if final is None:
            raise RuntimeError(f"Strands tool {self.name!r} ended without a result")
        if final.exception is not None:
            raise final.exception
        result: Any = final.tool_result
        if not isinstance(result, Mapping):
            # A module tool's function returns its result as it likes; the reference's executor
            # reads it with ``result.get(...)``, and what has no ``get`` fails there, told as a
            # failure escaped from the tool. (A ``None`` the reference passes on as a
            # ``toolResult`` of null, which no provider takes: the same failure here.)
            missing = AttributeError(f"'{type(result).__name__}' object has no attribute 'get'")
            raise ToolFailure(*escaped_failure(missing))
        return dict(result)


def _without_stop_iteration(agent_tool: AgentTool) -> AgentTool:
    """``agent_tool``, or when its function is sync a copy whose function turns a
    ``StopIteration`` into the ordinary failure it is, told as the reference tells one of that
    type: Strands runs that function in a worker thread, from which a ``StopIteration`` never
    reaches the awaiting tool (under the reference the invocation hangs)."""
    fn = getattr(agent_tool, "_tool_func", None)
    if not callable(fn) or inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        return agent_tool
    # A module tool's failure escapes its ``stream``; a decorated tool's is told by Strands.
    tell = escaped_failure if isinstance(agent_tool, PythonAgentTool) else failure

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except StopIteration as exc:
            raise ToolFailure(*tell(exc)) from exc

    # A copy: the tool stays as its owner made it. ``_tool_func`` is where Strands' function
    # tools (decorated and module ones) keep the function they call.
    guarded = copy.copy(agent_tool)
    guarded._tool_func = call  # type: ignore[attr-defined]
    return guarded


async def _mirror_cancel(cancel: CancelSignal, event: threading.Event) -> None:
    await cancel.wait()
    event.set()


def strands_tools(target: Any) -> list[Tool] | None:
    """The Cairn tools for ``target`` when it holds Strands tools; None when it holds none.

    ``target``: a Strands tool, a module of ``@strands.tool`` functions or a module tool
    (``TOOL_SPEC`` and a function named as the module), or a sequence mixing Strands and Cairn
    tools.
    """
    if isinstance(target, AgentTool):
        return [StrandsTool(target)]
    if isinstance(target, ModuleType):
        try:
            found = load_tools_from_module(target, target.__name__.rpartition(".")[2])
        except (AttributeError, TypeError):
            return None
        return [StrandsTool(each) for each in found]
    if isinstance(target, Sequence) and not isinstance(target, str | bytes):
        if not any(isinstance(item, AgentTool) for item in target):
            return None
        if not all(isinstance(item, AgentTool | Tool) for item in target):
            return None
        return [StrandsTool(item) if isinstance(item, AgentTool) else item for item in target]
    return None
