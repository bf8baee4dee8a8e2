"""Strands Agents SDK interoperability: Strands tools and agents run by Cairn (``cairn[strands]``).

Nothing here is imported by the rest of Cairn unless an agent names a Strands object, and then
the ``strands`` package is already loaded by the user's own module. Imported without the
package, this raises a ``ModuleNotFoundError`` naming the extra to install.
"""

from __future__ import annotations

try:
    import strands  # noqa: F401 - checks the extra is installed
except ModuleNotFoundError as exc:
    if exc.name != "strands":
        raise
    raise ModuleNotFoundError(
        "Strands agents and tools need the strands-agents package; install it with: "
        "pip install 'cairn[strands]'",
        name="strands",
    ) from exc
