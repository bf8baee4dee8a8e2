"""Cairn: durable AI agent execution over Kafka."""
