"""A deployment's agents from a Python registry or a TOML/YAML file, validated at start-up."""

from service.agent_config.errors import AgentConfigError
from service.agent_config.loader import describe_agents, load_agents

__all__ = ["AgentConfigError", "describe_agents", "load_agents"]
