"""The agent loop and its parts: pure asyncio, nothing of Kafka or the wire."""
