"""Log setup of the service: one JSON object per line, tagged with the session and command at hand.

The tags come from context variables set by :func:`log_context` (inherited by tasks created inside
it) or from a record's ``extra``; ``extra`` wins. A record never fails to format: values that
JSON cannot hold are written as their ``str``. Repeated warnings and errors are rate-limited by
:class:`~service.observability.log_repeats.RepeatFilter` on the service's handler.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from typing import IO, Any, Final, Literal

import orjson

from service.observability.log_repeats import RepeatFilter

CONTEXT_FIELDS: Final = ("session_id", "command_id", "trace_id")

_session_id: ContextVar[str | None] = ContextVar("cairn_session_id", default=None)
_command_id: ContextVar[str | None] = ContextVar("cairn_command_id", default=None)
_trace_id: ContextVar[str | None] = ContextVar("cairn_trace_id", default=None)
_VARS: Final = {"session_id": _session_id, "command_id": _command_id, "trace_id": _trace_id}

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_RESERVED: Final = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime"}
)

LogFormat = Literal["json", "text"]


@contextmanager
def log_context(
    *, session_id: str | None = None, command_id: str | None = None, trace_id: str | None = None
) -> Iterator[None]:
    """Tag every log line written inside the block (and by tasks started inside it)."""
    given = {"session_id": session_id, "command_id": command_id, "trace_id": trace_id}
    tokens: list[tuple[ContextVar[str | None], Token[str | None]]] = []
    for name, value in given.items():
        if value is not None:
            var = _VARS[name]
            tokens.append((var, var.set(value)))
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def current_context() -> dict[str, str]:
    """The tags set by the enclosing :func:`log_context` blocks."""
    return {name: value for name, var in _VARS.items() if (value := var.get()) is not None}


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line: time, level, logger, message, context tags, extras."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(current_context())
        entry.update(
            (key, value)
            for key, value in vars(record).items()
            if key not in _RESERVED and not key.startswith("_")
        )
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(entry, default=str).decode()


class ContextTextFormatter(logging.Formatter):
    """Human-readable lines for local runs, with the context tags appended when present."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        tags = {**current_context()}
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                tags[name] = str(value)
        if not tags:
            return line
        return line + " [" + ", ".join(f"{k}={v}" for k, v in tags.items()) + "]"


class _ServiceHandler(logging.StreamHandler[IO[str]]):
    """Marks the handler this module installed, so configuring twice replaces it."""

    def close(self) -> None:
        # Counts of suppressed records still waiting for their interval to end are written now
        # (``logging.shutdown`` closes every handler at exit).
        for installed in list(self.filters):
            if isinstance(installed, RepeatFilter):
                installed.close()
        super().close()


def configure_logging(
    level: str | int = "INFO",
    *,
    fmt: LogFormat = "json",
    stream: IO[str] | None = None,
    repeat_limit: int = 0,
    repeat_interval_s: float = 10.0,
) -> logging.Handler:
    """Route the root logger to one handler on ``stream`` (stderr by default); idempotent.

    With ``repeat_limit`` > 0, of the warnings and errors of one kind only that many per
    ``repeat_interval_s`` are written, then one line counting the rest (see
    :mod:`service.observability.log_repeats`). Returns the installed handler so a caller (a test)
    can remove it again.
    """
    root = logging.getLogger()
    for old in list(root.handlers):
        if isinstance(old, _ServiceHandler):
            root.removeHandler(old)
            old.close()
    handler = _ServiceHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else ContextTextFormatter())
    if repeat_limit > 0:
        handler.addFilter(
            RepeatFilter(handler.handle, limit=repeat_limit, interval_s=repeat_interval_s)
        )
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    # Library chatter at INFO (every metadata refresh, every connection) drowns the service's own.
    for noisy in ("aiokafka", "kafka", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return handler
