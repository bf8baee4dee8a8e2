"""Anthropic's citations as Converse citations, the shape a ``citationsContent`` block holds.

Guarantee: every citation of a streamed text block is kept, with its title, its cited text and
where it points, converted field by field as Strands' Anthropic model converts it (so a
history is the same whichever provider wrote it); a citation of a kind this module does not
know keeps its title and cited text, and loses only its location (with a warning).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

logger = logging.getLogger(__name__)

_Locate = Callable[[dict[str, Any]], dict[str, Any]]


def converse_citation(raw: dict[str, Any]) -> dict[str, Any]:
    """One Converse citation from an Anthropic citation object (as the API sent it)."""
    citation: dict[str, Any] = {}
    # Documents have a document_title, search and web results a title; Converse has one field.
    title = raw.get("title") or raw.get("document_title")
    if title:
        citation["title"] = title
    if raw.get("cited_text"):
        citation["sourceContent"] = [{"text": raw["cited_text"]}]
    kind = raw.get("type")
    locate = _LOCATIONS.get(kind) if isinstance(kind, str) else None
    if locate is None:
        logger.warning("citation_type=<%s> | unknown citation kind, kept without location", kind)
    else:
        citation["location"] = locate(raw)
    return citation


def _web(raw: dict[str, Any]) -> dict[str, Any]:
    url = raw.get("url") or ""
    web: dict[str, Any] = {"url": url}
    try:
        domain = urlparse(url).hostname
    except ValueError:  # a malformed URL (bad brackets) costs the domain, not the reply
        domain = None
    if domain:
        web["domain"] = domain
    return {"web": web}


def _span(name: str, index: tuple[str, str], start: str, end: str) -> _Locate:
    """A location of an index (its Converse and Anthropic names) and a start and an end; a
    field the citation lacks counts as 0, as in the reference."""
    ours, theirs = index

    def locate(raw: dict[str, Any]) -> dict[str, Any]:
        span = {ours: raw.get(theirs, 0), "start": raw.get(start, 0), "end": raw.get(end, 0)}
        return {name: span}

    return locate


_DOCUMENT = ("documentIndex", "document_index")
_LOCATIONS: dict[str, _Locate] = {
    "web_search_result_location": _web,
    "search_result_location": _span(
        "searchResultLocation",
        ("searchResultIndex", "search_result_index"),
        "start_block_index",
        "end_block_index",
    ),
    "char_location": _span("documentChar", _DOCUMENT, "start_char_index", "end_char_index"),
    "page_location": _span("documentPage", _DOCUMENT, "start_page_number", "end_page_number"),
    "content_block_location": _span(
        "documentChunk", _DOCUMENT, "start_block_index", "end_block_index"
    ),
}
