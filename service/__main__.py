"""``python -m service``: the same command line as ``cairn``."""

from service.early_stop import exit_on_early_stop

exit_on_early_stop()  # before the imports below, which take the longest part of a start

from service.cli import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
