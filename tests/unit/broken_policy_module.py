"""Raises at import: the custom policy loader must report it, not crash."""

raise RuntimeError("this module fails at import")
