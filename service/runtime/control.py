"""The control-topic seam of one partition: where cancel commands arrive.

Guarantee: every control record is accounted for exactly once, its offset committed only with
its effect: a cancel's own result and state (through its session queue), an ``error`` result for
an invalid one that names its session and id, or a dead-letter record for the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from service.observability.metrics import Metrics
from service.runtime.cancels import CancelDesk
from service.runtime.records import dlq_record, session_key
from service.runtime.work import CommandWork, InputRecord, Outcome
from service.wire.codec import decode_control
from service.wire.commands import CancelCommand
from service.wire.errors import WireError

logger = logging.getLogger(__name__)


def parse_cancel(record: InputRecord) -> CancelCommand:
    """Decode a control-topic record; raises :class:`WireError` when it is not a cancel."""
    if record.value is None:
        raise WireError("record has no value")
    return decode_control(record.value, key=record.key)


class ControlHandler:
    def __init__(
        self,
        submit: Callable[[Outcome], None],
        desk: CancelDesk,
        put: Callable[[CommandWork], None],
        dlq_topic: str,
        metrics: Metrics | None = None,
    ) -> None:
        self._submit = submit
        self._desk = desk
        self._put = put
        self._dlq_topic = dlq_topic
        self._metrics = metrics if metrics is not None else Metrics()

    def handle(self, record: InputRecord) -> None:
        try:
            cancel = parse_cancel(record)
        except WireError as exc:
            if exc.answerable and exc.session_id is not None:
                self._put(CommandWork(record, exc.session_id, None, exc))
                return
            logger.warning(
                "key=<%s>, offset=<%d>, reason=<%s> | undecodable control record sent to the dlq",
                session_key(record),
                record.origin.offset,
                exc.reason,
            )
            self._metrics.command("cancel", "dlq")
            self._metrics.dlq(exc.code)
            self._submit(
                Outcome(
                    records=[dlq_record(self._dlq_topic, record, exc.reason, exc.code)],
                    finished=[record.origin],
                    replay_unsafe=True,
                )
            )
            return
        logger.info(
            "session_id=<%s>, cancel_id=<%s>, target=<%s> | cancel read",
            cancel.session_id,
            cancel.command_id,
            cancel.target_command_id,
        )
        self._put(self._desk.read(record, cancel))
