"""Where Kafka's default partitioner puts a keyed record, as the service's clients' producers
do: murmur2 of the key, its sign bit cleared, modulo the topic's partition count.

The hash is pure Python in aiokafka and every result and event record asks for it, most for a
key asked for just before (one session's records of one step), so hashes are cached.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable

from aiokafka.partitioner import murmur2

_CACHED_KEYS = 1 << 16


@functools.lru_cache(maxsize=_CACHED_KEYS)
def _hash(key: bytes) -> int:
    return int(murmur2(key)) & 0x7FFFFFFF


def keyed_partition(key: bytes, partitions: int) -> int:
    """The partition of ``key`` in a topic of ``partitions`` partitions."""
    return _hash(key) % partitions


def partition_among(key: bytes | None, partitions: list[int]) -> int:
    """The partition of ``key`` among ``partitions`` (all of the topic's, sorted); a record
    without a key goes to any of them."""
    if key is None:
        return random.choice(partitions)
    return partitions[keyed_partition(key, len(partitions))]


def session_owner(partition: int, partitions: int | None) -> Callable[[str], bool] | None:
    """Whether a session id's records are keyed to ``partition`` of ``partitions`` (``None``
    when that is not checked)."""
    if partitions is None:
        return None
    return lambda session_id: keyed_partition(session_id.encode(), partitions) == partition
