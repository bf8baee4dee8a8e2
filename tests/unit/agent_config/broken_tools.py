"""A tool module that fails while being imported."""

raise RuntimeError("database URL missing")
