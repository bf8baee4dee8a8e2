"""Where a new owner starts reading its input partitions: their committed offsets, once no
transaction may still move them.

Guarantee: :func:`stable_starts` returns only offsets no open transaction may move any more (an
earlier owner's commit ended, or was aborted by fencing its producer), or raises
:class:`~service.runtime.transport.CommitFailedError` past its bound; a partition with no
committed offset starts at its beginning.
"""

from __future__ import annotations

import asyncio

from aiokafka import TopicPartition

from service.runtime.transport import CommitFailedError, InputSource
from service.runtime.txn_stream import TransactionStream

_POLL_S = 0.05


async def stable_starts(
    stream: TransactionStream,
    source: InputSource,
    inputs: list[TopicPartition],
    *,
    partition: int,
    timeout_s: float,
    settle_s: float,
) -> dict[TopicPartition, int]:
    """The committed offsets of ``inputs`` once no transaction may still move them.

    Offsets stay unstable while the previous owner's transaction that commits them is open.
    A live owner's transaction ends within moments; one still open after ``settle_s`` belongs
    to an instance that died or stalled mid-commit, and fencing the producer the committed
    offsets name (its InitProducerId aborts that transaction) saves waiting for the broker's
    transaction timeout. Offsets can also stay pending with no transaction left to end them:
    a broker restart may drop the markers of a transaction it completed, the one to the
    group's offsets partition among them. Only a marker of the same producer id ends those,
    so the owner also runs an abort-only transaction with the group's offsets as that
    producer and as its own (in ``partition`` mode the same id: its own InitProducerId ended
    nothing). The offsets go back to the last commit whose markers were written; what was
    read since is read again and answered from the session state, as after any failed
    commit. Beyond ``timeout_s`` (the transaction timeout and a commit's) it raises, and the
    owner fails and is re-created.
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + timeout_s
    released: set[str] = set()
    while (found := await stream.stable_offsets(inputs)) is None:
        now = loop.time()
        if now >= deadline:
            raise CommitFailedError(
                f"partition {partition}: the input offsets stayed unstable for "
                f"{now - started:.0f} s"
            )
        if now - started >= settle_s:
            holders = await stream.committed_metadata(inputs) | {stream.transactional_id}
            for transactional_id in sorted(holders - released):
                await stream.release_offsets(transactional_id)
                released.add(transactional_id)
        await asyncio.sleep(_POLL_S)
    missing = [tp for tp, (offset, _) in found.items() if offset < 0]
    beginnings = await source.beginning_offsets(missing) if missing else {}
    return {tp: beginnings[tp] if offset < 0 else offset for tp, (offset, _) in found.items()}
