"""Session-state upcasters: each turns the dict of version N into the dict of version N+1.

Registered by the version they read; :func:`upcast` applies them in order up to the current
version, so a state written by any released version still loads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service.agent.state import SESSION_STATE_VERSION

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

UPCASTERS: dict[int, Upcaster] = {}
"""``UPCASTERS[n]`` reads version ``n`` and returns version ``n + 1``."""


class StateVersionError(ValueError):
    """The state's version is unknown here (newer than this build, or no upcaster path)."""


def register(version: int) -> Callable[[Upcaster], Upcaster]:
    def wrap(fn: Upcaster) -> Upcaster:
        if version in UPCASTERS:
            raise ValueError(f"an upcaster from version {version} is already registered")
        UPCASTERS[version] = fn
        return fn

    return wrap


def upcast(
    data: dict[str, Any],
    *,
    current: int = SESSION_STATE_VERSION,
    upcasters: dict[int, Upcaster] | None = None,
) -> dict[str, Any]:
    chain = UPCASTERS if upcasters is None else upcasters
    version = data.get("schema_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise StateVersionError(f"session state schema_version {version!r} is not valid")
    if version > current:
        raise StateVersionError(
            f"session state schema_version {version} is newer than this build ({current})"
        )
    while version < current:
        step = chain.get(version)
        if step is None:
            raise StateVersionError(f"no upcaster from session state version {version}")
        data = step(data)
        version += 1
        data["schema_version"] = version
    return data


@register(1)
def _messages_may_move_to_history(data: dict[str, Any]) -> dict[str, Any]:
    """Version 2 keeps messages in history records beside a head; a version 1 state, written
    whole, is a valid version 2 state with its messages inline (converted on its next write).
    Version 1 readers refuse version 2 heads, which they would read as an empty conversation."""
    return data
