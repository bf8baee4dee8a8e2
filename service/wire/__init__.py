"""Pydantic models of every message on the wire, their codec and the contract export."""
