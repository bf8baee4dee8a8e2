"""A retriable error of a rebalance step, as aiokafka hands it to the consumer's user, is
retried by the instance, not the end of it (after a broker restart the group coordinator
answers SyncGroup with COORDINATOR_LOAD_IN_PROGRESS while it loads the group)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.consumer.group_coordinator import CoordinatorGroupRebalance
from aiokafka.errors import GroupAuthorizationFailedError, KafkaError

from service.runtime.kafka_transport import KafkaInput, rebalance_step_failed


class _Coordinator:
    """What aiokafka's SyncGroup step reads of its coordinator, answering with ``code``."""

    def __init__(self, code: int) -> None:
        self.code = code
        self.generation = 3
        self.member_id = "m"
        self.rejoin = 0

    async def _send_req(self, request: object) -> SimpleNamespace:
        return SimpleNamespace(error_code=self.code, member_assignment=b"")

    def request_rejoin(self) -> None:
        self.rejoin += 1


async def _sync_group_error(code: int) -> KafkaError:
    step = CoordinatorGroupRebalance.__new__(CoordinatorGroupRebalance)
    coordinator = _Coordinator(code)
    step._coordinator = coordinator  # type: ignore[assignment]
    step.group_id = "g"
    with pytest.raises(KafkaError) as raised:
        await step._send_sync_group_request(None)
    assert coordinator.rejoin == 1, "aiokafka asks to join again before it raises"
    return raised.value


async def test_aiokafka_hands_sync_groups_load_in_progress_over_as_a_retriable_step() -> None:
    error = await _sync_group_error(14)
    assert type(error) is KafkaError, "a bare KafkaError naming the error, as of aiokafka 0.14"
    assert rebalance_step_failed(error)


@pytest.mark.parametrize("code", [82, 30])  # FENCED_INSTANCE_ID (unknown to aiokafka), auth
async def test_other_sync_group_errors_stay_fatal(code: int) -> None:
    assert not rebalance_step_failed(await _sync_group_error(code))


@pytest.mark.parametrize(
    "error",
    [
        KafkaError("UnknownError()"),
        KafkaError("NoSuchName()"),
        KafkaError("GroupLoadInProgressError()", "more"),
        KafkaError(),
        GroupAuthorizationFailedError("g"),
        RuntimeError("GroupLoadInProgressError()"),
    ],
)
def test_only_a_bare_kafka_error_naming_a_retriable_one_is_a_failed_step(
    error: BaseException,
) -> None:
    assert not rebalance_step_failed(error)


class _Consumer:
    def __init__(self, *raised: BaseException) -> None:
        self.raised = list(raised)

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[Any, Any]:
        if self.raised:
            raise self.raised.pop(0)
        return {}


async def test_a_fetch_that_meets_a_failed_rebalance_step_returns_nothing_and_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    error = await _sync_group_error(14)
    source = KafkaInput(cast(AIOKafkaConsumer, _Consumer(error)))
    with caplog.at_level(logging.WARNING):
        assert await source.fetch(100, 10) == {}
    assert "GroupLoadInProgressError()> | a step of the group's rebalance failed" in caplog.text
    assert await source.fetch(100, 10) == {}

    fatal = KafkaInput(cast(AIOKafkaConsumer, _Consumer(GroupAuthorizationFailedError("g"))))
    with pytest.raises(GroupAuthorizationFailedError):
        await fatal.fetch(100, 10)
