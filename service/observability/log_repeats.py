"""Rate limit of repeated log records, so that a broker outage writes a few lines, not thousands.

Guarantee: of the records at WARNING and above that share a logger, a level, a message template
(the format string before its arguments) and the types of the exceptions they carry, the first
``limit`` of every interval pass unchanged, so the first occurrence of a message is never dropped;
the rest are counted, and one record ("suppressed N similar records: <template>") reports them
when their interval ends (even if nothing else is logged by then) or when the handler closes.
Records below WARNING always pass. A passing record of aiokafka's whose exception is a transient
connection error loses its traceback, the error appended to its one line; a passing record keeps
every other traceback. Per record the cost is one dictionary lookup under a lock.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from aiokafka.errors import (
    KafkaConnectionError,
    KafkaError,
    NoBrokersAvailable,
    NodeNotReadyError,
    RequestTimedOutError,
)

SUMMARY: Final = "suppressed %d similar records: %s"

# What a lost or restarting broker raises. A KafkaError raised *from* one of these (aiokafka
# wraps them so) counts too; an error merely raised while handling one does not, as that may
# well be a bug.
_TRANSIENT: Final = (
    KafkaConnectionError,
    NodeNotReadyError,
    NoBrokersAvailable,
    RequestTimedOutError,
    ConnectionError,
)
_CAUSE_DEPTH: Final = 5

_Key = tuple[str, int, str, tuple[type[BaseException], ...]]


@dataclass(slots=True)
class _Window:
    ends: float
    passed: int = 0
    suppressed: int = 0
    last: logging.LogRecord | None = None


class RepeatFilter(logging.Filter):
    """A handler's filter that passes ``limit`` records of a kind per ``interval_s`` seconds.

    ``emit`` writes the summary records (the handler's ``handle``; summaries pass this filter).
    With ``timer`` a daemon timer writes a summary whose interval ended while nothing else was
    logged; without it (tests with their own ``clock``) the next record or :meth:`close` does.
    """

    def __init__(
        self,
        emit: Callable[[logging.LogRecord], object],
        *,
        limit: int,
        interval_s: float,
        level: int = logging.WARNING,
        clock: Callable[[], float] = time.monotonic,
        timer: bool = True,
    ) -> None:
        if limit < 1 or interval_s <= 0:
            raise ValueError("limit must be at least 1 and interval_s positive")
        super().__init__()
        self._emit = emit
        self._limit = limit
        self._interval_s = interval_s
        self._level = level
        self._clock = clock
        self._use_timer = timer
        self._lock = threading.Lock()
        self._windows: dict[_Key, _Window] = {}
        # Earliest end of a window holding suppressed records; the next sweep of ended windows.
        self._due = float("inf")
        self._sweep_at = clock() + interval_s
        self._timer: threading.Timer | None = None
        self._closed = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self._level or getattr(record, "_repeat_summary", False):
            return True
        key = _key_of(record)
        now = self._clock()
        summaries: list[logging.LogRecord] = []
        with self._lock:
            if now >= self._due or now >= self._sweep_at:
                summaries = self._collect(now, everything=False)
            window = self._windows.get(key)
            if window is None or now >= window.ends:
                window = self._windows[key] = _Window(now + self._interval_s)
            if window.passed < self._limit:
                window.passed += 1
                keep = True
            else:
                keep = False
                window.suppressed += 1
                window.last = record
                if window.ends < self._due:
                    self._due = window.ends
                    self._arm(now)
        self._write(summaries)
        if keep:
            _drop_transient_traceback(record)
        return keep

    def flush_due(self) -> None:
        """Write the summaries of every interval that has ended."""
        with self._lock:
            summaries = self._collect(self._clock(), everything=False)
        self._write(summaries)

    def close(self) -> None:
        """Write every pending summary now (the intervals not ended too); stop the timer."""
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            summaries = self._collect(self._clock(), everything=True)
        self._write(summaries)

    def _collect(self, now: float, *, everything: bool) -> list[logging.LogRecord]:
        """Forget the ended windows, returning the summaries of those that suppressed records."""
        summaries = []
        due = float("inf")
        for key, window in list(self._windows.items()):
            if everything or now >= window.ends:
                del self._windows[key]
                if window.suppressed and window.last is not None:
                    summaries.append(self._summary(key, window.suppressed, window.last))
            elif window.suppressed and window.ends < due:
                due = window.ends
        self._due = due
        self._sweep_at = now + self._interval_s
        return summaries

    def _summary(self, key: _Key, count: int, last: logging.LogRecord) -> logging.LogRecord:
        name, level, template, _ = key
        summary = logging.LogRecord(
            name, level, last.pathname, last.lineno, SUMMARY, (count, template), None, last.funcName
        )
        # As ``extra`` would: fields of the JSON line; the marker (underscored) is not written.
        summary.__dict__.update(
            suppressed=count,
            interval_s=self._interval_s,
            last_message=_message_of(last),
            _repeat_summary=True,
        )
        return summary

    def _write(self, summaries: list[logging.LogRecord]) -> None:
        for summary in summaries:
            # A fresh context: a summary belongs to no session, whichever task logged last.
            contextvars.Context().run(self._emit, summary)

    def _arm(self, now: float) -> None:
        if not self._use_timer or self._timer is not None or self._closed:
            return
        self._timer = threading.Timer(max(self._due - now, 0.0), self._on_timer)
        self._timer.daemon = True
        self._timer.start()

    def _on_timer(self) -> None:
        with self._lock:
            self._timer = None
            if self._closed:
                return
            now = self._clock()
            summaries = self._collect(now, everything=False)
            if self._due != float("inf"):
                self._arm(now)
        self._write(summaries)


def _key_of(record: logging.LogRecord) -> _Key:
    template = record.msg if isinstance(record.msg, str) else str(record.msg)
    # A new kind of error under a known template is news: it gets its own allowance.
    errors: tuple[type[BaseException], ...] = ()
    if isinstance(record.args, tuple):
        errors = tuple(type(arg) for arg in record.args if isinstance(arg, BaseException))
    if record.exc_info and record.exc_info[1] is not None:
        errors = (*errors, type(record.exc_info[1]))
    return (record.name, record.levelno, template, errors)


def _message_of(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # noqa: BLE001 - a record whose arguments do not fit still gets counted
        return str(record.msg)


def is_transient(error: BaseException) -> bool:
    """A connection-level error of a lost broker, or aiokafka's KafkaError raised from one."""
    current: BaseException | None = error
    for _ in range(_CAUSE_DEPTH):
        if isinstance(current, _TRANSIENT):
            return True
        if not isinstance(current, KafkaError):
            return False
        current = current.__cause__
    return False


def _drop_transient_traceback(record: logging.LogRecord) -> None:
    if not record.exc_info or record.name.partition(".")[0] != "aiokafka":
        return
    error = record.exc_info[1]
    if error is None or not is_transient(error):
        return
    # The traceback of a lost connection shows aiokafka's retry loop, never a cause to fix.
    text = str(error)
    if not isinstance(error, KafkaError):
        text = f"{type(error).__name__}: {text}"
    record.msg = f"{_message_of(record)}: {text}"
    record.args = ()
    record.exc_info = None
    record.exc_text = None
