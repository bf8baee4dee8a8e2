"""What every partition owner of an instance shares: its settings and agents, its Kafka
clients, its in-flight count, the decoded-session cache and what was seen of the broker's
absences. One context per instance; owners come and go around it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from service.agent.definition import AgentDefinition
from service.observability.metrics import Metrics
from service.runtime.committer import CommitObserver
from service.runtime.faults import FaultPoints
from service.runtime.idle_expiry import Outages
from service.runtime.left_open import Held
from service.runtime.restore import Sessions
from service.runtime.standby import Standby
from service.runtime.streams import Streams
from service.runtime.transport import InputSource
from service.sessions.cache import SessionCache
from service.settings import Settings


class InFlight:
    """Commands accepted by this instance and not yet committed; drives fetch backpressure."""

    __slots__ = ("count", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0

    @property
    def full(self) -> bool:
        return self.count >= self.limit


@dataclass(slots=True)
class OwnerContext:
    """What every owner of this instance shares."""

    settings: Settings
    agents: Mapping[str, AgentDefinition]
    inputs: InputSource
    """The instance's group consumer of the input topics (shared with the consumer loop)."""
    streams: Streams
    """Where each owner's transactions go (the instance's stream or one of its own)."""
    inflight: InFlight
    faults: FaultPoints
    on_restored: Callable[[int], None]
    sessions: Sessions
    store_root: Path
    """Folder of the local session stores, one subfolder per partition."""
    standby: Standby | None = None
    """Follows the partitions not owned here; an owner takes its partition's table from it."""
    observer: CommitObserver | None = None
    metrics: Metrics = field(default_factory=Metrics)
    partitions: int | None = None
    """Partition count of the input topics: a record whose key belongs on another partition
    (Kafka's default partitioner) is refused, and no state of a session another partition owns
    is written. ``None``: not checked (records placed without regard to their keys)."""
    held: dict[int, Held] = field(default_factory=dict)
    """By partition: what an owner that failed decided to publish again and did not publish."""
    cache: SessionCache = field(default_factory=SessionCache)
    """The decoded sessions of every owner, within the instance's one budget."""
    outages: Outages = field(default_factory=Outages)
    """What the owners saw of the broker's absences: idle expiry holds after one on every
    partition, whichever owner saw it."""
