"""The engine step without a broker: a CancelledError that is not a cancel of the task is a failure.

Such a command is answered (``internal``) and the next command of its session is handled; a real
cancel of the task still propagates and answers nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest

from service.agent.definition import AgentDefinition
from service.agent.provider import ModelChunk, ModelProvider, ModelRequest
from service.providers.scripted import ScriptedModel
from service.runtime.answers import Answers
from service.runtime.cancels import CancelDesk
from service.runtime.command_path import CommandPath
from service.runtime.invoker import Invoker
from service.runtime.records import ParsedCommand
from service.runtime.session_queue import SessionQueues
from service.runtime.work import CommandWork, InputRecord, Origin, Outcome
from service.settings import TopicSettings
from tests.support.session_records import writer_for

TOPICS = TopicSettings()


class LeakyModel(ModelProvider):
    """A provider whose client leaks a CancelledError from an inner timeout."""

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        return self._stream()

    async def _stream(self) -> AsyncIterator[ModelChunk]:
        raise asyncio.CancelledError
        yield  # pragma: no cover - makes this an async generator


class HangingModel(ModelProvider):
    """A provider that never answers; ``called`` is set once it was asked."""

    def __init__(self) -> None:
        self.called = asyncio.Event()

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        return self._stream()

    async def _stream(self) -> AsyncIterator[ModelChunk]:
        self.called.set()
        await asyncio.Event().wait()
        yield  # pragma: no cover - makes this an async generator


def _work(agent: str, command_id: str, offset: int) -> CommandWork:
    record = InputRecord(Origin(TOPICS.commands, 0, offset), b"s", b"{}", [], 10)
    command = ParsedCommand(
        type="invoke", command_id=command_id, session_id="s", agent=agent, input="hi"
    )
    return CommandWork(record, "s", command)


def _path(outcomes: list[Outcome], **models: ModelProvider) -> CommandPath:
    """A command path with the real invoker, its engine running the agents of ``models``."""

    async def durable() -> None:
        return None

    writer = writer_for()
    answers = Answers(writer=writer, submit=outcomes.append, topics=TOPICS, max_bytes=1 << 20)
    return CommandPath(
        store=writer.store,
        cancels=CancelDesk(writer=writer, submit=outcomes.append, topics=TOPICS),
        invoker=Invoker(
            writer=writer,
            submit=outcomes.append,
            durable=durable,
            stopping=lambda: False,
            topics=TOPICS,
            answers=answers,
            state_max_bytes=1 << 20,
        ),
        answers=answers,
        submit=outcomes.append,
        agents={name: AgentDefinition(name=name, model=model) for name, model in models.items()},
        topics=TOPICS,
    )


def _answers(outcomes: list[Outcome]) -> dict[str, dict[str, object]]:
    """The results published, by command id."""
    bodies = [
        orjson.loads(record.value)
        for outcome in outcomes
        for record in outcome.records
        if record.topic == TOPICS.results and record.value is not None
    ]
    return {body["command_id"]: body for body in bodies}


async def test_a_stray_cancel_is_answered_and_the_next_command_runs() -> None:
    outcomes: list[Outcome] = []
    path = _path(outcomes, leaky=LeakyModel(), fine=ScriptedModel(["done"]))
    async with asyncio.TaskGroup() as tasks:
        queues = SessionQueues(tasks, path.handle)
        queues.put(_work("leaky", "c1", 0))
        queues.put(_work("fine", "c2", 1))
        await asyncio.wait_for(queues.wait_idle(), 5)
    answers = _answers(outcomes)
    assert set(answers) == {"c1", "c2"}
    error = answers["c1"]["error"]
    assert isinstance(error, dict) and error["code"] == "internal"
    assert answers["c2"]["stop_reason"] == "end_turn"
    finished = [origin.offset for outcome in outcomes for origin in outcome.finished]
    assert sorted(finished) == [0, 1]


async def test_a_cancel_of_the_task_still_propagates_unanswered() -> None:
    outcomes: list[Outcome] = []
    model = HangingModel()
    path = _path(outcomes, hanging=model)
    task = asyncio.create_task(path.handle(_work("hanging", "c1", 0)))
    await asyncio.wait_for(model.called.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert outcomes == []
