"""Imports of the optional provider SDKs, so the base install stays lean.

Guarantee: a missing SDK surfaces as :class:`MissingExtraError` naming the pip extra to install,
never as a bare ``ModuleNotFoundError`` deep inside a request.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtraError(ImportError):
    """A provider's SDK is not installed; the message names the extra that brings it."""

    def __init__(self, module: str, extra: str) -> None:
        super().__init__(
            f"the {extra!r} model provider needs the {module!r} package; "
            f"install it with: pip install 'cairn[{extra}]'"
        )
        self.extra = extra


def import_sdk(module: str, extra: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` naming ``extra``."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] == module.split(".")[0]:
            raise MissingExtraError(module, extra) from exc
        raise
