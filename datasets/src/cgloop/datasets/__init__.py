"""The trace store: ClickHouse schema and migrations, the store server, analyst queries."""
