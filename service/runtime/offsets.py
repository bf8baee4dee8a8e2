"""Offset bookkeeping of one input partition while its records finish out of order.

Guarantee: the offset offered for commit is always the lowest record not yet finished (or the
next record to read when everything is finished), so a crash never skips unfinished work.
"""

from __future__ import annotations


class OffsetTracker:
    """Records arrive in offset order and finish in any order."""

    __slots__ = ("_committed", "_next", "_open")

    def __init__(self, start: int) -> None:
        self._open: dict[int, bool] = {}
        self._next = start
        self._committed = start

    def received(self, offset: int) -> None:
        if offset < self._next:
            raise ValueError(f"offset {offset} received after {self._next - 1}")
        self._open[offset] = False
        self._next = offset + 1

    def finished(self, offset: int) -> None:
        if offset in self._open:
            self._open[offset] = True
            while self._open:
                first = next(iter(self._open))
                if not self._open[first]:
                    break
                del self._open[first]

    def accepts(self, offset: int) -> bool:
        """Whether a fetched record is new (a refetch after a seek is not)."""
        return offset >= self._next

    @property
    def position(self) -> int:
        """Lowest offset not yet finished: what a commit may record."""
        for offset in self._open:
            return offset
        return self._next

    def take_commit(self) -> int | None:
        """The position if it moved since the last commit, and remember it as committed."""
        position = self.position
        if position == self._committed:
            return None
        self._committed = position
        return position

    @property
    def committed(self) -> int:
        """The position last handed out by :meth:`take_commit`."""
        return self._committed

    @property
    def unfinished(self) -> int:
        return sum(1 for done in self._open.values() if not done)
