"""``python -m service``: the same command line as ``cairn``."""

from service.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
