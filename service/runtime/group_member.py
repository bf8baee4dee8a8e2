"""The instance's consumer group membership on the broker (a
:class:`~service.runtime.transport.GroupMember` over aiokafka's group coordinator).

Guarantee: :meth:`KafkaGroupMember.current` is True only on the group coordinator's answer to a
heartbeat sent by that very call, received within a session timeout of sending it; so it proves
the membership current after whatever preceded the call, a pause of the process included (a
pause while the request was out makes the answer too late to count). aiokafka keeps its own
heartbeat's outcome to itself (its routine acts on it and keeps no record), so the member sends
one of its own, aiokafka's request with the membership aiokafka holds, to the coordinator
aiokafka found; it changes nothing of aiokafka's state but what ``_send_req`` does on a failed
request (marking the coordinator for a new lookup, as its own heartbeat would).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from aiokafka.protocol.group import HeartbeatRequest

from service.runtime.kafka_transport import FENCED_BY_GROUP
from service.runtime.txn_offset_commit import Membership

logger = logging.getLogger(__name__)


class KafkaGroupMember:
    def __init__(
        self, consumer: AIOKafkaConsumer, instance_id: str | None, *, session_timeout_s: float
    ) -> None:
        self._consumer = consumer
        self._instance_id = instance_id
        self._session_timeout_s = session_timeout_s

    def membership(self) -> Membership | None:
        return membership_of(self._consumer, self._instance_id)

    async def current(self) -> bool | None:
        membership = self.membership()
        if membership is None:
            return False
        coordinator = self._consumer._coordinator  # aiokafka keeps the generation there
        request = HeartbeatRequest(
            coordinator.group_id, membership.generation_id, membership.member_id
        )
        loop = asyncio.get_running_loop()
        sent = loop.time()
        try:
            async with asyncio.timeout(self._session_timeout_s):
                response = await coordinator._send_req(request)
        except (KafkaError, TimeoutError):
            return None
        if loop.time() - sent >= self._session_timeout_s:
            return None  # it may have waited out a pause: the group may have moved on since
        if response.error_code == 0:
            return True
        return False if response.error_code in FENCED_BY_GROUP else None


def membership_of(consumer: AIOKafkaConsumer, instance_id: str | None) -> Membership | None:
    """The consumer's current group membership; None outside a generation (between losing its
    membership and rejoining), when no transaction may commit offsets."""
    coordinator = consumer._coordinator  # aiokafka keeps the generation there
    if coordinator is None or coordinator.generation < 0 or not coordinator.member_id:
        return None
    return Membership(coordinator.generation, coordinator.member_id, instance_id)


class MembershipWatch:
    """Whether the instance still counts as a member of its group, from what aiokafka already
    knows (no request, so a readiness probe may ask as often as it likes): the generation it
    joined, and a group coordinator reached within the last session timeout.

    aiokafka keeps its generation while it cannot reach the broker, and marks the coordinator
    unknown at the first request to it that fails; unknown for a session timeout, no heartbeat
    reached the coordinator for that long, so the group has expired the membership and given
    its partitions to others. The instance then serves nothing until it rejoins: not ready,
    though alive (a restart would not bring the broker back). Sampled at each turn of the fetch
    loop and at each probe, so the time is that of the first sample to see it unknown.

    A generation judged expired so stays not current when the coordinator is found again, until
    aiokafka drops it (its heartbeat told it so: it rejoins under a new one) or a heartbeat of
    our own (:meth:`run`, ``ask``) is answered for it: a coordinator back from a restart may
    still know the member, which then keeps its partitions and must not wait for a rejoin that
    never comes. Without that, the instance reported ready in the heartbeat interval between
    finding the coordinator and learning that its membership had expired.
    """

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        *,
        session_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._consumer = consumer
        self._session_timeout_s = session_timeout_s
        self._clock = clock
        self._unreached_since: float | None = None
        self._expired: int | None = None
        """The generation judged expired, until it is dropped or a heartbeat proves it current."""
        self._reached = asyncio.Event()
        """Set while the coordinator is known and a generation judged expired waits for proof."""

    def lost(self) -> str | None:
        """Why the membership is not current, or None while it is (as far as aiokafka knows)."""
        membership = membership_of(self._consumer, None)
        if membership is None or membership.generation_id != self._expired:
            self._expired = None
            self._reached.clear()
        if membership is None:
            self._unreached_since = None
            return "no group membership: joining the group"
        if self._consumer._coordinator.coordinator_id is not None:
            self._unreached_since = None
            if self._expired is None:
                return None
            self._reached.set()
            return (
                "group coordinator reachable again after the membership expired: waiting for "
                "it to answer a heartbeat"
            )
        self._reached.clear()
        now = self._clock()
        if self._unreached_since is None:
            self._unreached_since = now
        unreached_s = now - self._unreached_since
        if unreached_s < self._session_timeout_s:
            return None
        self._expired = membership.generation_id
        return (
            f"group coordinator unreachable for {unreached_s:.0f} s, past the session timeout: "
            "the group membership has expired"
        )

    async def run(self, ask: Callable[[], Awaitable[bool | None]], retry_s: float) -> None:
        """Prove a generation judged expired current once its coordinator is reachable again:
        one heartbeat of our own (``ask``, :meth:`KafkaGroupMember.current`) per ``retry_s``
        while it is unanswered. Runs until cancelled."""
        while True:
            await self._reached.wait()
            generation = self._expired
            try:
                current = await ask()
            except Exception:  # a failed probe must not end the instance
                logger.warning(
                    "generation=<%s> | membership heartbeat failed: asked again",
                    generation,
                    exc_info=True,
                )
                current = None
            if current and generation is not None and generation == self._expired:
                self._expired = None
                self._reached.clear()
                continue
            # Not answered yet, or over (aiokafka's own heartbeat will drop the generation).
            await asyncio.sleep(retry_s)
