"""The store: one process owns the chDB data folder, applies migrations and serves queries."""
