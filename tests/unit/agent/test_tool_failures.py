"""Tool failures that are not plain exceptions: a stray CancelledError, an unprintable exception.

Each must end as the tool's error result with the invocation going on; a real cancellation of
the task running the invocation must still propagate.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from engine_helpers import call, check_history, echo, invoke, make_agent, results_of, roundtrip

from service.agent.hooks import AfterToolCallEvent, HookProvider, HookRegistry
from service.agent.state import SessionState
from service.agent.tools import tool

STARTED: dict[str, asyncio.Event] = {}
"""Set by ``waits_forever`` once it runs; made anew by each test (events bind to one loop)."""


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for this one")


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text for this one")


@tool
async def inner_timeout() -> str:
    """Fail as a library does when one of its inner timeouts leaks a CancelledError."""
    raise asyncio.CancelledError


@tool
def inner_timeout_in_thread() -> str:
    """The same from a worker thread."""
    raise asyncio.CancelledError


@tool(inline=True)
def unprintable_error() -> str:
    """Raise an exception that cannot be turned into text."""
    raise UnprintableError


@tool(inline=True)
def unprintable_value() -> Any:
    """Return a value that is neither JSON nor printable."""
    return Unprintable()


@tool
async def waits_forever() -> str:
    """Block until the task running the invocation is cancelled."""
    STARTED["event"].set()
    await asyncio.Event().wait()
    return "never"


TOOLS = [echo, inner_timeout, inner_timeout_in_thread, unprintable_error, unprintable_value]


def new_state() -> SessionState:
    return SessionState(session_id="s-failures")


@pytest.mark.parametrize("executor", ["sequential", "concurrent"])
@pytest.mark.parametrize("name", ["inner_timeout", "inner_timeout_in_thread"])
async def test_a_stray_cancelled_error_is_the_tools_error_result(executor: str, name: str) -> None:
    script = [[call(name, "a"), call("echo", "b", text="next")], "done"]
    agent = make_agent(script, checkpointing=False, tools=TOOLS, executor=executor)
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "end_turn"
    first, second = results_of(out.state.messages[2])
    assert first["status"] == "error"
    assert first["content"][0]["text"].startswith("Error: CancelledError")
    assert second == {"toolUseId": "b", "status": "success", "content": [{"text": "next"}]}
    check_history(out.state)
    roundtrip(out.state)


async def test_after_tool_call_hooks_see_the_stray_cancelled_error() -> None:
    seen: list[BaseException | None] = []

    class Watch(HookProvider):
        def register_hooks(self, registry: HookRegistry) -> None:
            registry.add_callback(AfterToolCallEvent, lambda e: seen.append(e.exception))

    agent = make_agent(
        [call("inner_timeout", "a"), "done"], checkpointing=False, tools=TOOLS, hooks=[Watch()]
    )
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "end_turn"
    assert len(seen) == 1 and isinstance(seen[0], asyncio.CancelledError)


@pytest.mark.parametrize("executor", ["sequential", "concurrent"])
async def test_a_real_cancellation_of_the_task_still_propagates(executor: str) -> None:
    STARTED["event"] = asyncio.Event()
    script = [[call("waits_forever", "a"), call("waits_forever", "b")], "never"]
    agent = make_agent(script, checkpointing=False, tools=[waits_forever], executor=executor)
    task = asyncio.create_task(invoke(agent, new_state(), "go"))
    await asyncio.wait_for(STARTED["event"].wait(), 5)
    task.cancel()
    # Waited on without cancelling it again: a task that swallowed the cancel fails here.
    await asyncio.wait({task}, timeout=5)
    assert task.cancelled()


async def test_an_exception_without_text_gets_the_text_of_what_its_str_raised() -> None:
    script = [[call("unprintable_error", "a"), call("unprintable_value", "b")], "done"]
    agent = make_agent(script, checkpointing=False, tools=TOOLS)
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "end_turn"
    first, second = results_of(out.state.messages[2])
    # As in the reference: what ``__str__`` raised escapes the tool's handling, told as such.
    assert first == {
        "toolUseId": "a",
        "status": "error",
        "content": [{"text": "Error: no text for this one"}],
    }
    assert second["status"] == "error"
    assert "Unprintable" in second["content"][0]["text"]
    check_history(out.state)
    roundtrip(out.state)


class UnprintableValueError(ValueError):
    def __str__(self) -> str:
        raise RuntimeError("no text for this value error")


class TwiceUnprintableError(Exception):
    def __str__(self) -> str:
        raise UnprintableError


class ThriceUnprintableError(Exception):
    def __str__(self) -> str:
        raise TwiceUnprintableError


@tool(inline=True)
def raises(kind: str) -> str:
    """Raise an exception whose text cannot be had, in one of several ways."""
    errors: dict[str, type[Exception]] = {
        "value": UnprintableValueError,
        "twice": TwiceUnprintableError,
        "thrice": ThriceUnprintableError,
    }
    raise errors[kind]


@pytest.mark.parametrize(
    ("kind", "text", "seen"),
    [
        ("value", "Error: no text for this value error", RuntimeError),
        ("twice", "Error: no text for this one", RuntimeError),
        # The reference's invocation itself raises here; Cairn names the tool's exception.
        ("thrice", "Error: ThriceUnprintableError", ThriceUnprintableError),
    ],
)
async def test_an_unprintable_exception_is_told_as_the_reference_tells_it(
    kind: str, text: str, seen: type[BaseException]
) -> None:
    exceptions: list[BaseException | None] = []

    class Watch(HookProvider):
        def register_hooks(self, registry: HookRegistry) -> None:
            registry.add_callback(AfterToolCallEvent, lambda e: exceptions.append(e.exception))

    script = [call("raises", "a", kind=kind), "done"]
    agent = make_agent(script, checkpointing=False, tools=[raises], hooks=[Watch()])
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "end_turn"
    assert results_of(out.state.messages[2]) == [
        {"toolUseId": "a", "status": "error", "content": [{"text": text}]}
    ]
    assert len(exceptions) == 1 and type(exceptions[0]) is seen


async def test_after_tool_call_hooks_see_an_unknown_tool_as_the_reference_reports_it() -> None:
    seen: list[BaseException | None] = []

    class Watch(HookProvider):
        def register_hooks(self, registry: HookRegistry) -> None:
            registry.add_callback(AfterToolCallEvent, lambda e: seen.append(e.exception))

    agent = make_agent([call("nosuch", "a"), "done"], checkpointing=False, hooks=[Watch()])
    out = await invoke(agent, new_state(), "go")
    assert out.stop == "end_turn"
    assert len(seen) == 1 and type(seen[0]) is Exception
    assert str(seen[0]) == "Unknown tool: nosuch"


@tool
def stops() -> str:
    """Raise StopIteration from a worker thread."""
    raise StopIteration("no more")


@tool(inline=True)
def stops_inline() -> str:
    """Raise StopIteration on the event loop."""
    raise StopIteration


@pytest.mark.parametrize(
    ("name", "text"),
    [("stops", "Error: StopIteration - no more"), ("stops_inline", "Error: StopIteration - ")],
)
async def test_a_stop_iteration_is_an_ordinary_tool_error(name: str, text: str) -> None:
    seen: list[BaseException | None] = []

    class Watch(HookProvider):
        def register_hooks(self, registry: HookRegistry) -> None:
            registry.add_callback(AfterToolCallEvent, lambda e: seen.append(e.exception))

    script = [call(name, "a"), "done"]
    agent = make_agent(script, checkpointing=False, tools=[stops, stops_inline], hooks=[Watch()])
    # Raised into an asyncio future, a StopIteration would leave the await waiting for ever.
    out = await asyncio.wait_for(invoke(agent, new_state(), "go"), 5)
    assert out.stop == "end_turn"
    assert results_of(out.state.messages[2]) == [
        {"toolUseId": "a", "status": "error", "content": [{"text": text}]}
    ]
    assert len(seen) == 1 and type(seen[0]) is StopIteration
