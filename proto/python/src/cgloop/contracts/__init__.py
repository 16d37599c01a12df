"""cgloop's wire contracts on the Python side.

The message classes are generated into ``cgloop.v1`` by ``make proto``; this package adds what
is hand-written: the schema version producers stamp into every ``RecordHeader`` and, in
``cgloop.contracts.samples``, the canonical sample records shared with the Rust crate.
"""

# Version of the cgloop.v1 record schemas; mirrors SCHEMA_VERSION in the Rust crate cgloop-proto.
SCHEMA_VERSION = 1

__all__ = ["SCHEMA_VERSION"]
