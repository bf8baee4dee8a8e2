"""W3C trace context: read ``traceparent`` from a command's headers, write a child onto its outputs.

Parsing follows the W3C Trace Context rules (an invalid header is ignored, never an error). When
OpenTelemetry's API is installed and an SDK is configured, spans are real and their ids go on the
outputs, and the engine's model and tool spans (``service.agent.tracing``) are OpenTelemetry
spans nested under the command's. Otherwise a child span id is generated locally so the trace
still connects: with the API but no SDK provider no OpenTelemetry span is started (it would
record nothing, at a sixth of a step's CPU), and without the API nothing of it is imported.
"""

from __future__ import annotations

import logging
import os
import random
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Final

from service.agent.tracing import NO_SPAN, NO_TRACING, Attributes, AttributeValue, Span, Tracer

logger = logging.getLogger(__name__)

TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
_TRACESTATE_MAX: Final = 512

_PARENT_RE: Final = re.compile(
    r"^(?P<version>[0-9a-f]{2})-(?P<trace>[0-9a-f]{32})-(?P<span>[0-9a-f]{16})-(?P<flags>[0-9a-f]{2})"
)
_ZERO_TRACE: Final = "0" * 32
_ZERO_SPAN: Final = "0" * 16

Headers = Iterable[tuple[str, bytes | str | None]]
"""Record headers as the Kafka client gives them: (name, value) pairs."""


@dataclass(frozen=True, slots=True)
class TraceContext:
    """One span's identity in a trace: ``trace_id`` (32 hex), ``span_id`` (16 hex), flags."""

    trace_id: str
    span_id: str
    flags: str = "00"
    tracestate: str | None = None

    @property
    def sampled(self) -> bool:
        return bool(int(self.flags, 16) & 0x01)

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"

    def child(self) -> TraceContext:
        """A new span of the same trace, parented by this one."""
        return TraceContext(self.trace_id, _new_span_id(), self.flags, self.tracestate)

    def headers(self) -> list[tuple[str, bytes]]:
        """Kafka record headers carrying this context."""
        out = [(TRACEPARENT, self.traceparent.encode())]
        if self.tracestate:
            out.append((TRACESTATE, self.tracestate.encode()))
        return out

    @classmethod
    def new_root(cls) -> TraceContext:
        trace = random.getrandbits(128)
        return cls(f"{trace or 1:032x}", _new_span_id())


def _new_span_id() -> str:
    # Ids need to be unique, not secret (as OpenTelemetry's SDK makes them): the process's
    # generator, not a system call per span as secrets would make.
    return f"{random.getrandbits(64) or 1:016x}"


def parse_traceparent(
    value: str | bytes | None, tracestate: str | bytes | None = None
) -> TraceContext | None:
    """The context named by a ``traceparent`` value, or None when absent or invalid."""
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    value = value.strip()
    match = _PARENT_RE.match(value)
    if match is None:
        return None
    version = match["version"]
    if version == "ff":
        return None
    # Version 00 has exactly four fields; a later version may append more after a dash.
    if version == "00" and len(value) != 55:
        return None
    if len(value) > 55 and value[55] != "-":
        return None
    if match["trace"] == _ZERO_TRACE or match["span"] == _ZERO_SPAN:
        return None
    return TraceContext(match["trace"], match["span"], match["flags"], _clean_state(tracestate))


def _clean_state(raw: str | bytes | None) -> str | None:
    if raw is None:
        return None
    if isinstance(raw, bytes):
        raw = raw.decode("ascii", errors="ignore")
    raw = raw.strip()
    return raw if raw and len(raw) <= _TRACESTATE_MAX else None


def from_headers(headers: Headers | None) -> TraceContext | None:
    """The trace context of a record, from its ``traceparent``/``tracestate`` headers."""
    if not headers:
        return None
    found: dict[str, bytes | str | None] = {}
    for name, value in headers:
        lowered = name.lower()
        if lowered in (TRACEPARENT, TRACESTATE) and lowered not in found:
            found[lowered] = value
    return parse_traceparent(found.get(TRACEPARENT), found.get(TRACESTATE))


@contextmanager
def span(
    name: str,
    parent: TraceContext | None,
    *,
    attributes: Mapping[str, str | int | float | bool] | None = None,
    use_otel: bool = True,
) -> Iterator[TraceContext]:
    """Open a span for work done on behalf of ``parent`` (or a new trace) and yield its context.

    Put ``yielded.headers()`` on every record the work produces.
    """
    if use_otel and _otel is not None and _otel.recording():
        with _otel.span(name, parent, attributes or {}) as ctx:
            yield ctx
        return
    yield parent.child() if parent is not None else TraceContext.new_root()


_PROVIDER_VARIABLE: Final = "OTEL_PYTHON_TRACER_PROVIDER"
"""The variable that makes the OpenTelemetry API load a provider at its first use."""


class _OtelBridge:
    """The OpenTelemetry path, used only when ``opentelemetry-api`` can be imported."""

    def __init__(self, trace_api: Any) -> None:
        self._trace = trace_api
        self._provider: Any = None
        self._tracer: Any = None
        self._inert = (trace_api.ProxyTracerProvider, trace_api.NoOpTracerProvider)
        # The API's getter looks the environment up at every call until a provider is set (2 %
        # of a step's CPU, measured): unset and named by no variable means none is installed.
        self._named_by_env = _PROVIDER_VARIABLE in os.environ

    def _current_tracer(self) -> Any:
        """The tracer of the installed provider, made again only when the provider changed
        (making one per span costs more than the span); ``None`` while no SDK provider is
        installed, when every span would record nothing and costs as much as a step."""
        if getattr(self._trace, "_TRACER_PROVIDER", False) is None and not self._named_by_env:
            return None
        provider = self._trace.get_tracer_provider()
        if provider is not self._provider:
            self._provider = provider
            recording = not isinstance(provider, self._inert)
            self._tracer = provider.get_tracer("cairn") if recording else None
        return self._tracer

    def recording(self) -> bool:
        """Whether a span would be recorded (an SDK provider is installed)."""
        return self._current_tracer() is not None

    @contextmanager
    def span(
        self, name: str, parent: TraceContext | None, attributes: Mapping[str, Any]
    ) -> Iterator[TraceContext]:
        tracer = self._current_tracer()
        if tracer is None:
            yield parent.child() if parent is not None else TraceContext.new_root()
            return
        api = self._trace
        context = None
        if parent is not None:
            remote = api.SpanContext(
                trace_id=int(parent.trace_id, 16),
                span_id=int(parent.span_id, 16),
                is_remote=True,
                trace_flags=api.TraceFlags(int(parent.flags, 16)),
            )
            context = api.set_span_in_context(api.NonRecordingSpan(remote))
        with tracer.start_as_current_span(
            name, context=context, kind=api.SpanKind.CONSUMER, attributes=dict(attributes)
        ) as s:
            sc = s.get_span_context()
            same_as_parent = parent is not None and f"{sc.span_id:016x}" == parent.span_id
            # Without an SDK the API hands back the parent (or nothing): make our own child then.
            if not sc.is_valid or same_as_parent:
                yield parent.child() if parent is not None else TraceContext.new_root()
            else:
                yield TraceContext(
                    f"{sc.trace_id:032x}",
                    f"{sc.span_id:016x}",
                    f"{int(sc.trace_flags):02x}",
                    parent.tracestate if parent is not None else None,
                )

    @contextmanager
    def engine_span(self, name: str, attributes: Attributes) -> Iterator[Span]:
        tracer = self._current_tracer()
        if tracer is None:
            yield NO_SPAN
            return
        with tracer.start_as_current_span(name, attributes=dict(attributes)) as s:
            yield _OtelSpan(s)

    def current(self) -> Span:
        if self._current_tracer() is None:
            return NO_SPAN
        return _OtelSpan(self._trace.get_current_span())


class _OtelSpan:
    """An OpenTelemetry span behind the engine's :class:`~service.agent.tracing.Span`."""

    __slots__ = ("_span",)

    def __init__(self, span: Any) -> None:
        self._span = span

    def set(self, key: str, value: AttributeValue) -> None:
        self._span.set_attribute(key, value)

    def failed(self, description: str, error: BaseException | None = None) -> None:
        from opentelemetry.trace import Status, StatusCode

        self._span.set_status(Status(StatusCode.ERROR, description))
        if error is not None:
            try:
                self._span.record_exception(error)
            except Exception:  # an exception that cannot be printed
                logger.debug("exception not recorded on its span", exc_info=True)


class _OtelTracer:
    """The engine's :class:`~service.agent.tracing.Tracer` over OpenTelemetry."""

    __slots__ = ("_bridge",)

    def __init__(self, bridge: _OtelBridge) -> None:
        self._bridge = bridge

    def span(self, name: str, attributes: Attributes) -> AbstractContextManager[Span]:
        return self._bridge.engine_span(name, attributes)


def engine_tracer() -> Tracer:
    """What the runtime hands the engine: OpenTelemetry spans when its API is installed."""
    return _OtelTracer(_otel) if _otel is not None else NO_TRACING


def current_span() -> Span:
    """The span current in this context (inside :func:`span`, the command's), to add its
    outcome to; a span that records nothing without OpenTelemetry."""
    return _otel.current() if _otel is not None else NO_SPAN


def _load_otel() -> _OtelBridge | None:
    try:
        from opentelemetry import trace as trace_api
    except ImportError:
        return None
    return _OtelBridge(trace_api)


_otel = _load_otel()
