"""The demo agent shipped with the service, so Cairn runs out of the box with no credentials."""

from service.demo.agents import agents

__all__ = ["agents"]
