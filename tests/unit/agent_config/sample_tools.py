"""Tools the agents-file tests import by path."""

from __future__ import annotations

from service.agent.hooks import HookProvider, HookRegistry
from service.agent.tools import tool


@tool
def lookup_order(order_id: str) -> str:
    """Look an order up by its id."""
    return f"order {order_id}: shipped"


def refund(order_id: str, amount: float) -> str:
    """Refund part of an order."""
    return f"refunded {amount} on {order_id}"


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two numbers."""
    return a * b


MATH = [add, multiply]
NOT_A_TOOL = 42


class Audit(HookProvider):
    def register_hooks(self, registry: HookRegistry) -> None:
        return None


@tool(effect="once", timeout_s=30)
def pay(order_id: str, amount: float) -> str:
    """Charge the customer."""
    return f"charged {amount} for {order_id}"


@tool(timeout_s=10, retries=3, backoff=2)
def fetch_rates(currency: str) -> str:
    """Today's exchange rates."""
    return f"rates for {currency}"


PAYMENTS = [pay, fetch_rates]
EMPTY: list[object] = []
