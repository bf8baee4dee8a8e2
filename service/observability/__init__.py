"""Operability of the service: Prometheus metrics, the health/metrics HTTP endpoint, JSON logs
and W3C trace context. Nothing here knows Kafka; the runtime reports into these objects.
"""
