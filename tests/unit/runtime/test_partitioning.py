"""The default partitioner's placement, as every Kafka client computes it."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner

from service.runtime.partitioning import keyed_partition, partition_among


def test_a_keyed_record_goes_where_kafkas_default_partitioner_puts_it() -> None:
    reference = DefaultPartitioner()
    for count in (1, 3, 6, 7, 64):
        partitions = list(range(count))
        for n in range(300):
            key = f"session-{n}".encode()
            expected = reference(key, partitions, partitions)
            assert keyed_partition(key, count) == expected
            assert keyed_partition(key, count) == expected  # cached, the same
            assert partition_among(key, partitions) == expected


def test_a_record_without_a_key_goes_to_one_of_the_partitions() -> None:
    assert {partition_among(None, [2, 5]) for _ in range(64)} <= {2, 5}
