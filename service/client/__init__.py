"""The command-line client for people trying Cairn: publish commands, follow sessions, show state.

It talks to Kafka only through the public topics and the wire models, as any upstream would.
"""
