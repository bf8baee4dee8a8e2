"""Kafka: consumer, per-partition owners, transactions, dispatcher, control, DLQ, health."""
