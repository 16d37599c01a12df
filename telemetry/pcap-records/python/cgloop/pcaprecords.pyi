"""cgloop.pcaprecords: a pcap/pcapng capture (gzip accepted) -> the FlowRecords the probe would
export, computed by the probe's own Rust pcap twin (telemetry/probe, the code `cgloop-probe pcap`
runs and the BPF agreement test checks) (Rust, PyO3)."""

import os

DEFAULT_INTERVAL_MS: int
DEFAULT_BURST_GAP_US: int
DEFAULT_RTP_CLOCK_HZ: int
DEFAULT_IDLE_TIMEOUT_MS: int
DEFAULT_TCP_END_TIMEOUT_MS: int

class CaptureError(ValueError):
    """The capture is damaged: bad magic is a plain ValueError; a truncated record header or
    record, a record longer than the snap length, a broken pcapng block or one naming an
    undescribed interface raise this, with `packet` (1-based, in capture order) and `offset`
    (where its record or block starts in the uncompressed stream), also named in the text:
    `cut.pcap: packet 4 at byte offset 276: truncated record header (7 of 16 bytes)`."""

    packet: int
    offset: int

def read(
    capture: str | os.PathLike[str] | bytes,
    *,
    interval_ms: int = 100,
    direction: str = "unspecified",
    burst_gap_us: int = 1000,
    rtp_clock_hz: int = 90000,
    rtp: bool = True,
    idle_timeout_ms: int = 10000,
    tcp_end_timeout_ms: int = 1000,
    source_id: str | None = None,
    name: str | None = None,
) -> tuple[bytes, dict[str, int]]:
    """Every FlowRecord the probe would export for the capture (a file path, or its bytes), as
    ONE serialized cgloop.v1.FlowRecordBatch in export order (sweep by sweep, as the binary
    writes them), and the run's counters (the probe's stat names: packets, accounted,
    flows_created, rtp_confirmed, the parse failures …, plus unsupported_link_frames and
    records).

    The keyword settings are the binary's flags (`cgloop-probe pcap --help`) with its defaults:
    sweep period (0: one record per flow), direction written into the records (unspecified,
    ingress, egress), burst gap, RTP clock of dynamic payload types, RTP detection, idle and
    TCP-end timeouts, the records' source id (default `pcap/<name>`). `name` names a capture
    given as bytes in messages and the default source id (default: the file name, or
    "capture").

    Raises CaptureError (a ValueError) for a damaged capture, ValueError for one that is not a
    capture or has an unsupported link type, OSError when the file cannot be read. Runs
    without the GIL."""
