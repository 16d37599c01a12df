"""The daemons' metrics endpoints as declared once in proto/cgloop/v1/ops.proto, read from the
generated descriptors: each Daemon's default Prometheus port on 127.0.0.1, the command that runs
it and what it is. `cgloop.metrics` takes every Python daemon's default --metrics-addr from
here; the Rust crate reads the same options (cgloop_proto::ops), and a test compares the two
readings (`table()` against `cgloop-vectors ops-table`).
"""

from __future__ import annotations

from typing import Any

from cgloop.v1 import ops_pb2
from cgloop.v1.ops_pb2 import Daemon, MetricsEndpoint

__all__ = [
    "LOOPBACK",
    "PORT_BLOCK",
    "Daemon",
    "MetricsEndpoint",
    "default_metrics_addr",
    "endpoint",
    "endpoints",
    "table",
]

# Where every default endpoint listens, and the block its ports are declared in (ops.proto).
LOOPBACK = "127.0.0.1"
PORT_BLOCK = range(9460, 9470)


def endpoint(which: int) -> MetricsEndpoint:
    """The declared metrics endpoint of one Daemon; KeyError for one that declares none."""
    options = Daemon.DESCRIPTOR.values_by_number[which].GetOptions()
    if not options.HasExtension(ops_pb2.metrics):
        raise KeyError(f"{Daemon.Name(which)} declares no (metrics) option in ops.proto")
    return options.Extensions[ops_pb2.metrics]


def endpoints() -> dict[int, MetricsEndpoint]:
    """Every daemon's endpoint, by Daemon number, in declaration order."""
    return {v.number: endpoint(v.number) for v in Daemon.DESCRIPTOR.values if v.number != 0}


def default_metrics_addr(which: int) -> str:
    """`127.0.0.1:<port>`: where `which` serves /metrics unless configured otherwise."""
    return f"{LOOPBACK}:{endpoint(which).port}"


def table() -> dict[str, Any]:
    """The whole table in the shape `cgloop-vectors ops-table` prints (Rust's reading)."""
    return {
        "daemons": {
            Daemon.Name(n): {
                "port": e.port,
                "command": e.command,
                "description": e.description,
            }
            for n, e in endpoints().items()
        }
    }
