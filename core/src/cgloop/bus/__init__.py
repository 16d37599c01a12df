"""The Kafka bus: which topics exist, what each carries, and how batches travel.

Every message on a cgloop topic is one protobuf batch of records (see proto/cgloop/v1); a
message that does not decode as its topic's batch type goes to the dead-letter topic with the
reason, and the consumer carries on. Every consumer (the sink, the analytics worker, the
policy engine) decides what it refuses with the same `codec.decode` / `codec.check_headers`.
"""

from cgloop.bus.codec import DecodeError, check_headers, decode, decode_payload, encode
from cgloop.bus.topics import DEADLETTER, TOPICS, Topic, topic

__all__ = [
    "DEADLETTER",
    "TOPICS",
    "DecodeError",
    "Topic",
    "check_headers",
    "decode",
    "decode_payload",
    "encode",
    "topic",
]
