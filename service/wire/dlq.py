"""Dead-letter records: the original record unchanged, plus why and where it came from in headers.

The value, key and original headers are kept byte for byte, the original headers first and in
their order; Cairn appends its own, all UTF-8 strings, so a reader (or a replay tool) can find the
source record again. Only a record too large to keep whole loses something, and says what: the
end of its value (``cairn.dlq.truncated_from``) or its last original headers
(``cairn.dlq.headers_dropped``). Cairn's headers are the block that begins at the last
``cairn.dlq.reason``: an earlier ``cairn.dlq.*`` header (a replayed dead letter carries its old
ones) is the original record's, kept like any other and never read as Cairn's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service.wire.base import WIRE_SCHEMA_VERSION
from service.wire.errors import ErrorCode, WireError, WireIssue

DLQ_REASON = "cairn.dlq.reason"
DLQ_CODE = "cairn.dlq.code"
DLQ_SOURCE_TOPIC = "cairn.dlq.source.topic"
DLQ_SOURCE_PARTITION = "cairn.dlq.source.partition"
DLQ_SOURCE_OFFSET = "cairn.dlq.source.offset"
DLQ_SCHEMA_VERSION = "cairn.dlq.schema_version"
DLQ_TRUNCATED_FROM = "cairn.dlq.truncated_from"
"""Set only on a dead letter whose value was cut to fit: the original value's length in bytes."""
DLQ_HEADERS_DROPPED = "cairn.dlq.headers_dropped"
"""Set only on a dead letter that could not keep every original header: how many of the last
ones were left off (those kept are the first ones, in their order)."""
TRACEPARENT = "traceparent"
"""W3C trace context header, read from commands and written on results and events."""

MAX_REASON_LENGTH = 1024
"""Reasons are cut to this many characters so a header never dwarfs the record."""

DLQ_HEADER_FIELDS = {
    DLQ_REASON: "reason",
    DLQ_CODE: "code",
    DLQ_SOURCE_TOPIC: "source_topic",
    DLQ_SOURCE_PARTITION: "source_partition",
    DLQ_SOURCE_OFFSET: "source_offset",
    DLQ_SCHEMA_VERSION: "schema_version",
    DLQ_TRUNCATED_FROM: "truncated_from",
    DLQ_HEADERS_DROPPED: "headers_dropped",
}

Headers = Sequence[tuple[str, bytes]]


def _string_only(schema: dict[str, Any]) -> None:
    """Publish an optional header as a string: a header is absent or has a value, never null."""
    options = schema.pop("anyOf", [])
    schema.update(next(o for o in options if o.get("type") == "string"))
    schema.pop("default", None)


class DlqHeaders(BaseModel):
    """Cairn's headers on a dead-letter record (Kafka header values, decoded as UTF-8).

    Any other header is the original record's, kept as it was. ``reason`` is the first field:
    it opens Cairn's block of headers (see :func:`split_dlq_headers`).
    """

    # Extra headers are ignored when read and allowed by the published schema: the original
    # record's headers are kept on the dead letter, whatever their names.
    model_config = ConfigDict(
        strict=True,
        extra="ignore",
        frozen=True,
        populate_by_name=True,
        json_schema_extra={"additionalProperties": True},
    )

    reason: Annotated[str, Field(alias=DLQ_REASON, min_length=1, max_length=MAX_REASON_LENGTH)]
    code: Annotated[ErrorCode, Field(alias=DLQ_CODE)]
    source_topic: Annotated[str, Field(alias=DLQ_SOURCE_TOPIC, min_length=1)]
    source_partition: Annotated[str, Field(alias=DLQ_SOURCE_PARTITION, pattern=r"^[0-9]+$")]
    source_offset: Annotated[str, Field(alias=DLQ_SOURCE_OFFSET, pattern=r"^[0-9]+$")]
    schema_version: Annotated[str, Field(alias=DLQ_SCHEMA_VERSION, pattern=r"^1$")]
    truncated_from: Annotated[
        str | None,
        Field(
            alias=DLQ_TRUNCATED_FROM,
            pattern=r"^[0-9]+$",
            json_schema_extra=_string_only,
            description="Only on a dead letter whose value was cut to fit: the original "
            "value's length in bytes (the value kept is its first bytes).",
        ),
    ] = None
    headers_dropped: Annotated[
        str | None,
        Field(
            alias=DLQ_HEADERS_DROPPED,
            pattern=r"^[1-9][0-9]*$",
            json_schema_extra=_string_only,
            description="Only on a dead letter that could not keep every header of the original "
            "record: how many were left off, the last ones (those kept are the first, in order).",
        ),
    ] = None

    def to_headers(self) -> list[tuple[str, bytes]]:
        """Cairn's headers as Kafka headers; an absent optional header is not written."""
        dumped = self.model_dump(by_alias=True, exclude_none=True)
        return [(name, value.encode()) for name, value in dumped.items()]


def dlq_headers(
    original: Iterable[tuple[str, bytes | None]] | None,
    *,
    reason: str,
    topic: str,
    partition: int,
    offset: int,
    code: ErrorCode = "invalid_command",
) -> list[tuple[str, bytes | None]]:
    """The original headers followed by Cairn's, which begin with ``cairn.dlq.reason``."""
    ours = DlqHeaders(
        reason=reason[:MAX_REASON_LENGTH] or "unknown",
        code=code,
        source_topic=topic,
        source_partition=str(partition),
        source_offset=str(offset),
        schema_version=str(WIRE_SCHEMA_VERSION),
    )
    return [*(original or ()), *ours.to_headers()]


def split_dlq_headers(
    headers: Sequence[tuple[str, bytes | None]],
) -> tuple[list[tuple[str, bytes | None]], list[tuple[str, bytes | None]]]:
    """The original record's headers and Cairn's: Cairn's are the block from the last
    ``cairn.dlq.reason`` on, so an original header with a ``cairn.dlq.`` name (one a replayed
    dead letter carries) is never taken for Cairn's, even one Cairn does not write this time."""
    starts = [index for index, (name, _) in enumerate(headers) if name == DLQ_REASON]
    split = starts[-1] if starts else len(headers)
    return list(headers[:split]), list(headers[split:])


def read_dlq_headers(headers: Sequence[tuple[str, bytes | None]]) -> DlqHeaders:
    """Cairn's headers of a dead-letter record (see :func:`split_dlq_headers`); raises
    WireError."""
    found: dict[str, str] = {}
    try:
        for name, value in split_dlq_headers(headers)[1]:
            if name in DLQ_HEADER_FIELDS and value is not None:
                found[name] = value.decode()
        return DlqHeaders.model_validate(found)
    except UnicodeDecodeError as exc:
        raise WireError(f"dead-letter header is not UTF-8: {exc}") from None
    except ValidationError as exc:
        issues = tuple(
            WireIssue(".".join(str(p) for p in err["loc"]), err["msg"]) for err in exc.errors()
        )
        raise WireError("; ".join(map(str, issues)), issues=issues) from None
