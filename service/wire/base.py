"""Shared model bases and the wire schema version: strict on what Cairn reads, tolerant on output.

Inbound models (commands) refuse unknown fields so a typo is an error, not a silent default;
outbound models (results, events, state) ignore unknown fields so older readers keep working.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, StringConstraints
from pydantic_core import PydanticCustomError

WIRE_SCHEMA_VERSION: Literal[1] = 1
"""Major version of every message on the wire; bumped only by a breaking change."""


def _an_integer(value: Any) -> Any:
    # JSON's true and 1.0 are not the integer 1, though Python's True == 1.0 == 1 lets them match
    # Literal[1]. Refused as an integer field refuses them (a TypeError would escape pydantic),
    # so the reason names what was sent, as it does for every integer field.
    if isinstance(value, bool | float):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return value


WireVersion = Annotated[Literal[1], BeforeValidator(_an_integer)]
"""The versions this build reads; a breaking change adds the new one here during migration."""

MAX_ID_LENGTH = 256

Id = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_ID_LENGTH, pattern=r"^[^\x00]+$")
]
"""A session, command, tool-use or interrupt id: a non-empty string of at most 256 chars, with
no NUL character (the sessions topic keys a session's history records by its id and a NUL)."""

JsonObject = dict[str, Any]


def _require(schema: dict[str, Any], names: tuple[str, ...]) -> None:
    required = schema.setdefault("required", [])
    for name in names:
        if name in schema.get("properties", {}) and name not in required:
            required.insert(0, name)


def require_envelope(schema: dict[str, Any]) -> None:
    """Publish ``type`` and ``schema_version`` as required although Python callers may omit them."""
    _require(schema, ("schema_version", "type"))


def require_type(schema: dict[str, Any]) -> None:
    """Publish ``type`` as required; an inbound ``schema_version`` may be left out (it means 1)."""
    _require(schema, ("type",))


_ENVELOPE_FIELDS: dict[type[BaseModel], tuple[str, ...]] = {}


def mark_envelope_set(model: BaseModel) -> None:
    """Count ``type`` and ``schema_version`` as set: they are written even when left implicit."""
    cls = type(model)
    names = _ENVELOPE_FIELDS.get(cls)
    if names is None:
        # Looked up once per model class: every record Cairn writes or reads passes here.
        names = tuple(name for name in ("type", "schema_version") if name in cls.model_fields)
        _ENVELOPE_FIELDS[cls] = names
    if names:
        model.__pydantic_fields_set__.update(names)


class InboundModel(BaseModel):
    """A message Cairn receives: strict types, unknown fields refused."""

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
        json_schema_extra=require_type,
    )

    def model_post_init(self, context: Any, /) -> None:
        mark_envelope_set(self)


class OutboundModel(BaseModel):
    """A message Cairn writes: strict types, unknown fields ignored when read back."""

    model_config = ConfigDict(
        strict=True,
        extra="ignore",
        frozen=True,
        use_attribute_docstrings=True,
        json_schema_extra=require_envelope,
    )

    def model_post_init(self, context: Any, /) -> None:
        mark_envelope_set(self)


class PartModel(BaseModel):
    """A nested shape fixed by the reference (messages, resume payloads): exact keys only."""

    model_config = ConfigDict(
        strict=True, extra="forbid", frozen=True, use_attribute_docstrings=True
    )
