"""The control-topic seam of one partition: where cancel commands arrive.

Guarantee (of this minimal version): every control record is accounted for exactly once: its
offset is finished through the committer, so it is never re-read after a commit. Acting on a
cancel is not implemented here; records are logged and acknowledged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from service.runtime.records import session_key
from service.runtime.work import InputRecord, Outcome

logger = logging.getLogger(__name__)


class ControlHandler:
    def __init__(self, submit: Callable[[Outcome], None]) -> None:
        self._submit = submit

    def handle(self, record: InputRecord) -> None:
        logger.info(
            "session_id=<%s>, offset=<%d> | control record acknowledged without action",
            session_key(record),
            record.origin.offset,
        )
        self._submit(Outcome(finished=[record.origin]))
