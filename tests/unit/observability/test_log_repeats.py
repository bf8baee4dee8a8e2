"""Repeated warnings are rate-limited per kind and summed up in one line; first occurrences always
pass; aiokafka's transient connection errors lose their traceback, other errors keep theirs."""

from __future__ import annotations

import io
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import orjson
import pytest
from aiokafka.errors import KafkaConnectionError, KafkaError, NodeNotReadyError

from service.observability.log_repeats import SUMMARY, RepeatFilter, is_transient
from service.observability.logs import JsonFormatter, configure_logging, log_context

TEMPLATE = "Unable connect to node with id %s: %s"


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @property
    def messages(self) -> list[str]:
        return [r.getMessage() for r in self.records]


@dataclass
class Rig:
    handler: Collect
    repeats: RepeatFilter
    clock: Clock
    loggers: list[logging.Logger] = field(default_factory=list)

    def logger(self, name: str = "aiokafka") -> logging.Logger:
        # A logger of its own per test, named like the real one, wired to this rig only.
        log = logging.getLogger(f"{name}.test{uuid.uuid4().hex[:8]}")
        log.propagate = False
        log.setLevel(logging.DEBUG)
        log.addHandler(self.handler)
        self.loggers.append(log)
        return log


@pytest.fixture
def rig() -> Iterator[Rig]:
    handler = Collect()
    clock = Clock()
    repeats = RepeatFilter(handler.handle, limit=3, interval_s=10.0, clock=clock, timer=False)
    handler.addFilter(repeats)
    made = Rig(handler, repeats, clock)
    yield made
    for log in made.loggers:
        log.removeHandler(handler)


def _refused(port: int) -> ConnectionRefusedError:
    return ConnectionRefusedError(111, f"Connect call failed ('127.0.0.1', {port})")


def test_a_burst_passes_its_first_records_and_is_summed_up_when_the_interval_ends(
    rig: Rig,
) -> None:
    log = rig.logger()
    for port in range(20):
        log.error(TEMPLATE, 1, _refused(port))
    # The first occurrences pass unchanged, arguments and all.
    assert rig.handler.messages == [
        f"Unable connect to node with id 1: [Errno 111] Connect call failed ('127.0.0.1', {p})"
        for p in range(3)
    ]
    rig.clock.now += 9.9
    rig.repeats.flush_due()
    assert len(rig.handler.records) == 3
    rig.clock.now += 0.1
    rig.repeats.flush_due()
    summary = rig.handler.records[-1]
    assert summary.getMessage() == f"suppressed 17 similar records: {TEMPLATE}"
    assert (summary.name, summary.levelno) == (log.name, logging.ERROR)
    assert summary.__dict__["suppressed"] == 17
    assert "('127.0.0.1', 19)" in summary.__dict__["last_message"]
    # Written once: nothing is left to report.
    rig.repeats.flush_due()
    rig.repeats.close()
    assert len(rig.handler.records) == 4


def test_the_next_interval_starts_with_the_summary_then_passes_records_again(rig: Rig) -> None:
    log = rig.logger()
    for _ in range(5):
        log.warning("retrying %s", "x")
    rig.clock.now += 10.0
    for _ in range(5):
        log.warning("retrying %s", "y")
    assert rig.handler.messages == [
        *["retrying x"] * 3,
        "suppressed 2 similar records: retrying %s",
        *["retrying y"] * 3,
    ]


def test_different_kinds_pass_independently(rig: Rig) -> None:
    log = rig.logger()
    other = rig.logger("service.runtime")
    for _ in range(10):
        log.error(TEMPLATE, 1, _refused(1))
    # Another template, another level, another logger, another error under the same template:
    # each is a kind of its own, and its first occurrence passes however much the first floods.
    log.error("Unable to update metadata from %s", [1])
    log.warning(TEMPLATE, 1, _refused(1))
    other.error(TEMPLATE, 1, _refused(1))
    log.error(TEMPLATE, 1, KafkaConnectionError("Connection at 127.0.0.1:9092 closed"))
    log.error(TEMPLATE, 1, _refused(1))
    assert len(rig.handler.records) == 7
    kinds = {(r.name, r.levelno, r.msg, type(r.args[-1])) for r in rig.handler.records}
    assert len(kinds) == 5
    rig.repeats.close()
    assert rig.handler.messages[-1] == f"suppressed 8 similar records: {TEMPLATE}"


def test_records_below_warning_always_pass(rig: Rig) -> None:
    log = rig.logger("service.runtime")
    for partition in range(12):
        log.info("partition=<%d> | partition ready", partition)
    assert len(rig.handler.records) == 12


def test_close_writes_what_is_pending(rig: Rig) -> None:
    log = rig.logger()
    for _ in range(4):
        log.error("Unable to update metadata from %s", [1])
    assert len(rig.handler.records) == 3
    rig.repeats.close()
    assert rig.handler.messages == [
        *["Unable to update metadata from [1]"] * 3,
        "suppressed 1 similar records: Unable to update metadata from %s",
    ]


def test_a_flood_that_stops_is_summed_up_without_another_record() -> None:
    handler = Collect()
    handler.addFilter(RepeatFilter(handler.handle, limit=2, interval_s=0.2))
    log = logging.getLogger(f"aiokafka.test{uuid.uuid4().hex[:8]}")
    log.propagate = False
    log.setLevel(logging.DEBUG)
    log.addHandler(handler)
    try:
        for _ in range(50):
            log.error("Unable to update metadata from %s", [1])
        deadline = time.monotonic() + 5
        while len(handler.records) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert handler.messages == [
            "Unable to update metadata from [1]",
            "Unable to update metadata from [1]",
            "suppressed 48 similar records: Unable to update metadata from %s",
        ]
    finally:
        log.removeHandler(handler)


def _raise_wrapped() -> None:
    # How aiokafka's sender fails when the transaction coordinator's connection closes.
    try:
        raise KafkaConnectionError("Connection at 127.0.0.1:9092 closed")
    except KafkaConnectionError as err:
        raise KafkaError(repr(err)) from err


def test_aiokafka_tracebacks_of_lost_connections_become_one_line(rig: Rig) -> None:
    log = rig.logger("aiokafka.producer.sender")
    try:
        _raise_wrapped()
    except KafkaError:
        log.exception("Unexpected error in sender routine")
    (record,) = rig.handler.records
    assert record.exc_info is None
    assert record.getMessage() == (
        "Unexpected error in sender routine: "
        "KafkaError: KafkaConnectionError('Connection at 127.0.0.1:9092 closed')"
    )


@pytest.mark.parametrize(
    ("logger_name", "error"),
    [
        # A real bug in aiokafka, even while a connection was being lost.
        ("aiokafka.producer.sender", TypeError("unexpected")),
        # Cairn's own unexpected failures always keep their traceback.
        ("service.runtime", KafkaConnectionError("Connection at 127.0.0.1:9092 closed")),
    ],
)
def test_other_tracebacks_are_kept(rig: Rig, logger_name: str, error: Exception) -> None:
    log = rig.logger(logger_name)
    try:
        raise error
    except Exception:
        log.exception("Unexpected error")
    (record,) = rig.handler.records
    assert record.exc_info is not None
    assert record.getMessage() == "Unexpected error"


def test_an_error_raised_while_handling_a_lost_connection_is_not_transient() -> None:
    try:
        try:
            raise NodeNotReadyError("node 1")
        except NodeNotReadyError:
            raise KafkaError("bug while retrying") from None
    except KafkaError as err:
        assert not is_transient(err)
    assert is_transient(NodeNotReadyError("node 1"))
    assert is_transient(_refused(1))
    assert not is_transient(KafkaError("unknown"))


def test_a_first_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="limit"):
        RepeatFilter(lambda record: None, limit=0, interval_s=1.0)


def test_the_service_handler_writes_summaries_as_json_lines() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = configure_logging("INFO", stream=stream, repeat_limit=2, repeat_interval_s=60.0)
    name = f"aiokafka.test{uuid.uuid4().hex[:8]}"
    # Its own level: other tests may have quietened aiokafka's loggers.
    logging.getLogger(name).setLevel(logging.DEBUG)
    try:
        for _ in range(5):
            logging.getLogger(name).error("Unable to update metadata from %s", [1])
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        # Closing (as logging.shutdown does at exit) writes the count still pending.
        handler.close()
    lines = [orjson.loads(line) for line in stream.getvalue().splitlines()]
    mine = [line for line in lines if line["logger"] == name]
    assert [line["message"] for line in mine] == [
        "Unable to update metadata from [1]",
        "Unable to update metadata from [1]",
        SUMMARY % (3, "Unable to update metadata from %s"),
    ]
    summary = mine[-1]
    assert summary["level"] == "error"
    assert summary["suppressed"] == 3
    assert summary["last_message"] == "Unable to update metadata from [1]"
    assert "_repeat_summary" not in summary


def test_a_summary_carries_no_session_tags_of_the_record_that_released_it() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    clock = Clock()
    handler.addFilter(
        RepeatFilter(handler.handle, limit=1, interval_s=1.0, clock=clock, timer=False)
    )
    log = logging.getLogger(f"service.runtime.test{uuid.uuid4().hex[:8]}")
    log.propagate = False
    log.setLevel(logging.DEBUG)
    log.addHandler(handler)
    try:
        with log_context(session_id="s-1"):
            log.warning("session=<%s> | slow", "s-1")
            log.warning("session=<%s> | slow", "s-1")
        clock.now += 1.0
        with log_context(session_id="s-2"):
            log.warning("session=<%s> | slow", "s-2")
    finally:
        log.removeHandler(handler)
    lines = [orjson.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["message"], line.get("session_id")) for line in lines] == [
        ("session=<s-1> | slow", "s-1"),
        ("suppressed 1 similar records: session=<%s> | slow", None),
        ("session=<s-2> | slow", "s-2"),
    ]


def test_a_zero_limit_installs_no_filter() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = configure_logging("INFO", stream=stream, repeat_limit=0)
    try:
        assert not handler.filters
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
