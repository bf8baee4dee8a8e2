"""Turns OpenTelemetry's SDK on for the service when the process asks for it in the SDK's own
environment variables.

Guarantees: nothing of OpenTelemetry is imported unless ``OTEL_TRACES_EXPORTER`` names an
exporter (unset or ``none``: nothing happens, and ``OTEL_SDK_DISABLED=true`` wins); a tracer
provider installed before (by ``opentelemetry-instrument``) is left as it is; an SDK or an
exporter that is not installed is a one-line :class:`TracingSetupError`. Spans leave in batches
(the SDK's ``OTEL_BSP_*`` variables) and what is queued is flushed when the process exits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any, Final

logger = logging.getLogger(__name__)

EXPORTERS_VARIABLE: Final = "OTEL_TRACES_EXPORTER"
_ENTRY_POINTS: Final = "opentelemetry_traces_exporter"
_ALIASES: Final = {"otlp": ("otlp", "otlp_proto_http", "otlp_proto_grpc")}
_DEFAULT_SERVICE_NAME: Final = "cairn"


class TracingSetupError(RuntimeError):
    """Tracing was asked for and cannot be set up: one line for the operator."""


def exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names (comma-separated), ``none`` left out."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    raw = environ.get(EXPORTERS_VARIABLE, "")
    return [name for name in (part.strip() for part in raw.split(",")) if name and name != "none"]


def configure_tracing(environ: Mapping[str, str]) -> list[str]:
    """Install an SDK tracer provider exporting to the named exporters; returns their names
    (empty when tracing was not asked for or a provider was already installed)."""
    names = exporter_names(environ)
    if not names:
        return []
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise TracingSetupError(
            f"{EXPORTERS_VARIABLE} is set but the OpenTelemetry SDK is not installed "
            "(pip install 'cairn[otel]')"
        ) from None
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        logger.info("tracer provider already installed: %s left to it", EXPORTERS_VARIABLE)
        return []
    exporters = [_exporter(name)() for name in names]
    named = "OTEL_SERVICE_NAME" in environ or "service.name" in environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    resource = Resource.create({} if named else {"service.name": _DEFAULT_SERVICE_NAME})
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    logger.info("exporters=<%s> | tracing on", ",".join(names))
    return names


def _exporter(name: str) -> Callable[[], Any]:
    found = entry_points(group=_ENTRY_POINTS)
    for candidate in _ALIASES.get(name, (name,)):
        for entry in found:
            if entry.name == candidate:
                exporter: Callable[[], Any] = entry.load()
                return exporter
    installed = ", ".join(sorted({entry.name for entry in found})) or "none"
    raise TracingSetupError(
        f"{EXPORTERS_VARIABLE}: no span exporter {name!r} is installed (installed: {installed}; "
        "'otlp' comes with pip install 'cairn[otel]')"
    )
