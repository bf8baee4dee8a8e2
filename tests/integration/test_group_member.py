"""The group member's heartbeat against the real broker: the group coordinator answers that the
membership the consumer joined with is current, and that a stale generation or an unknown member
id is over; with no coordinator to ask there is no answer. What the runtime rests on before it
re-creates a failed owner."""

from __future__ import annotations

import dataclasses

import pytest
from aiokafka import AIOKafkaConsumer

from service.runtime.group_member import KafkaGroupMember, membership_of
from tests.conftest import CreateTopics

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(90)]


async def test_the_coordinator_tells_a_current_membership_from_one_that_is_over(
    kafka_bootstrap: str, kafka_topics: CreateTopics, unique_name: str
) -> None:
    (commands,) = await kafka_topics(f"{unique_name}.commands", partitions=2)
    consumer = AIOKafkaConsumer(
        commands,
        bootstrap_servers=kafka_bootstrap,
        group_id=f"{unique_name}-group",
        enable_auto_commit=False,
    )
    member = KafkaGroupMember(consumer, None, session_timeout_s=10.0)
    assert await member.current() is False, "not started: no membership"
    await consumer.start()
    try:
        await consumer.getmany(timeout_ms=5000)  # joined: a generation and a member id
        joined = membership_of(consumer, None)
        assert joined is not None
        assert await member.current() is True
        stale = {
            "generation": dataclasses.replace(joined, generation_id=joined.generation_id + 1),
            "member": dataclasses.replace(joined, member_id=f"{joined.member_id}-gone"),
        }
        for what, membership in stale.items():
            member.membership = lambda membership=membership: membership  # type: ignore[method-assign]
            assert await member.current() is False, what
        member.membership = lambda: joined  # type: ignore[method-assign]
        coordinator = consumer._coordinator
        found, coordinator.coordinator_id = coordinator.coordinator_id, None
        assert await member.current() is None, "no coordinator: no answer"
        coordinator.coordinator_id = found
        assert await member.current() is True
    finally:
        await consumer.stop()
