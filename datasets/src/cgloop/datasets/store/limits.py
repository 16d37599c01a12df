"""What one HTTP query may cost, and the request body it may send (env `CGLOOP_STORE_*`).

The per-query limits are ClickHouse settings fixed on each reader connection *before*
`readonly=1`, which then refuses every later change (`SET`, a `SETTINGS` clause): the client
cannot raise them. No imports of chDB here, so the body inflater can be tested (and used) alone.
"""

from __future__ import annotations

import zlib

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class QueryLimits(BaseSettings):
    """Limits of the store's HTTP endpoint; each field is `CGLOOP_STORE_<NAME>` in the env."""

    model_config = SettingsConfigDict(env_prefix="CGLOOP_STORE_", extra="ignore")

    # Seconds a query may run (ClickHouse `max_execution_time`; over it: code 159).
    max_execution_time: float = Field(default=60.0, gt=0)
    # Bytes of memory one query may use (`max_memory_usage`; over it: code 241).
    max_memory_usage: int = Field(default=4 << 30, gt=0)
    # Rows and bytes of one result (`max_result_rows`/`max_result_bytes`, overflow throws: 396).
    max_result_rows: int = Field(default=100_000_000, gt=0)
    max_result_bytes: int = Field(default=2 << 30, gt=0)
    # Bytes of the request body, counted after gzip/deflate decompression (over it: 413).
    max_body_bytes: int = Field(default=1 << 20, gt=0)
    # Queries running at once; one more is refused at once with code 202 (HTTP 503).
    max_concurrent_queries: int = Field(default=16, gt=0)

    def reader_settings(self) -> dict[str, str]:
        """The settings of a reader connection, in order: `readonly=1` last, so the limits
        before it take and nothing after it (the client's query) can change them."""
        return {
            "max_execution_time": f"{self.max_execution_time:g}",
            "timeout_overflow_mode": "throw",
            "max_memory_usage": str(self.max_memory_usage),
            "max_result_rows": str(self.max_result_rows),
            "max_result_bytes": str(self.max_result_bytes),
            "result_overflow_mode": "throw",
            # Arrow strings as the exact bytes (Binary). Clients cannot change a setting under
            # readonly=1, and clickhouse-connect refuses a request that would need one
            # (`query_arrow(use_strings=False)`, which `cgloop dataset export` makes); asking
            # for Binary, the lossless form, matches the server instead of failing.
            "output_format_arrow_string_as_string": "0",
            "readonly": "1",
        }

    def parser_settings(self) -> dict[str, str]:
        """The settings of the connection that only parses a query (see `guard`)."""
        return {"max_execution_time": f"{self.max_execution_time:g}", "readonly": "1"}


class BodyTooLarge(ValueError):
    """The request body, decompressed, is over the limit."""


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """`body` decoded per its Content-Encoding (gzip, deflate or none), refusing more than
    `limit` bytes of output *while* decompressing: a small bomb never grows past the limit.

    Raises BodyTooLarge, ValueError (unsupported encoding) or zlib.error (corrupt data)."""
    if encoding in ("", "identity"):
        if len(body) > limit:
            raise BodyTooLarge(f"query body of {len(body)} bytes exceeds {limit}")
        return body
    if encoding == "gzip":
        wbits = 16 + zlib.MAX_WBITS
    elif encoding == "deflate":  # HTTP's deflate is the zlib format
        wbits = zlib.MAX_WBITS
    else:
        raise ValueError(f"Content-Encoding {encoding!r} is not supported (gzip, deflate)")
    out = bytearray()
    data = body
    while data:  # gzip allows several members back to back
        stream = zlib.decompressobj(wbits)
        while data:
            # Never ask for more than one byte past what is still allowed.
            out += stream.decompress(data, limit + 1 - len(out))
            if len(out) > limit:
                raise BodyTooLarge(f"query body inflates to more than {limit} bytes")
            if stream.eof:
                break
            data = stream.unconsumed_tail
            if not data:
                raise zlib.error("truncated compressed body")
        data = stream.unused_data if stream.eof else b""
    return bytes(out)
