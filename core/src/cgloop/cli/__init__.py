"""The `cgloop` command line: one root app; each component registers its own commands."""
