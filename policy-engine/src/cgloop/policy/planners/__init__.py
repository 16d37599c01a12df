"""Planners used by global policies: pure functions, each citing the source it implements."""
