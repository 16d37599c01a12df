"""The embedded local stack: a real single-node KRaft Kafka broker and the trace store."""
