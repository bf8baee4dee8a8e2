"""The local wire server of the provider tests (it lives in ``tests.support.http_wire`` so the
service-level tests can serve the same scripted replies)."""

from tests.support.http_wire import Reply, Seen, WireServer, sse

__all__ = ["Reply", "Seen", "WireServer", "sse"]
