"""The sink: Kafka topics -> the trace store, at least once, without double counting."""
