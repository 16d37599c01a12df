"""The Kafka bus: which topics exist, what each carries, and how batches travel.

Every message on a cgloop topic is one protobuf batch of records (see proto/cgloop/v1); a
message that does not decode as its topic's batch type goes to the dead-letter topic with the
reason, and the consumer carries on.
"""

from cgloop.bus.codec import DecodeError, decode, encode
from cgloop.bus.topics import DEADLETTER, TOPICS, Topic, topic

__all__ = ["DEADLETTER", "TOPICS", "DecodeError", "Topic", "decode", "encode", "topic"]
