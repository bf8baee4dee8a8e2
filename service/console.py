"""The ``cairn`` console script: the early-stop handlers first, then the command line.

The script a package installer writes imports its entry module before calling it; this one
imports nothing heavy, so a SIGTERM or SIGINT during the start's imports already exits quietly
with status 0 (``service.early_stop``), as ``python -m service`` does.
"""

from service.early_stop import exit_on_early_stop


def main() -> int:
    exit_on_early_stop()
    from service.cli import main as run  # after the handlers, on purpose

    return run()
