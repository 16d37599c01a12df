"""The pcap twin (`cgloop telemetry pcap`, and the Python module cgloop.pcaprecords built on the
same code) on real captures in the lab's data folder (heistp/l4s-tests, BSD-2-Clause; ntop/nDPI
test captures, LGPL-3.0), and on bad files. No root needed."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from cgloop import pcaprecords
from cgloop.binaries import BinaryNotFound, find_binary
from cgloop.telemetry.probe_cli import ProbeError, flow_totals, run_pcap
from cgloop.testing import data_missing
from cgloop.v1.flow_pb2 import FlowRecordBatch

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
SKYPE = DATA / "l4s-tests" / "skype_bi_dualpi2_l.pcap.gz"
RTP = DATA / "ndpi-pcaps" / "rtp.pcapng"
ZOOM = DATA / "ndpi-pcaps" / "zoom.pcap"


@pytest.fixture(scope="module", autouse=True)
def binary() -> Path:
    try:
        return find_binary("cgloop-probe")
    except BinaryNotFound as exc:
        pytest.fail(str(exc))


def need(path: Path) -> Path:
    if not path.exists():
        data_missing(f"capture {path.name}")
    return path


def test_l4s_skype_ecn_tallies_match_the_dataset():
    # The data README: Skype's UDP put in the L4S queue, 6 657 ECT(1) and 3 790 CE upstream.
    result = run_pcap(need(SKYPE), "--interval-ms", "1000")
    totals = flow_totals(result.records)
    top = max(totals.values(), key=lambda t: t.ect1)
    assert (top.ect1, top.ce) == (6657, 3790)
    assert result.summary["packets"] == result.summary["accounted"] == 41655
    # Interval records: every one covers at most the interval, deltas add up to the totals.
    assert sum(r.packets for r in result.records) == 41655
    finals = [r for r in result.records if r.is_final]
    assert len(finals) == result.summary["flows_created"] >= len(totals)  # idle flows may resume


def test_rtp_capture_is_recognised():
    result = run_pcap(need(RTP), "--interval-ms", "0")
    rtp = [r for r in result.records if r.HasField("rtp")]
    assert result.summary["rtp_confirmed"] == len(rtp) >= 1
    assert all(r.is_final for r in result.records)  # one record per flow with --interval-ms 0
    for r in rtp:
        assert r.rtp.clock_rate_hz > 0 and r.five_tuple.ip_protocol == 17


def test_same_capture_same_records(tmp_path: Path):
    # gzip or not, the twin is deterministic: identical records byte for byte.
    plain = tmp_path / "skype.pcap"
    plain.write_bytes(gzip.decompress(need(SKYPE).read_bytes()))
    a = run_pcap(plain, "--interval-ms", "500").records
    b = run_pcap(SKYPE, "--interval-ms", "500", "--source-id", "pcap/skype.pcap").records
    assert [r.SerializeToString() for r in a] == [r.SerializeToString() for r in b]


def test_json_output_uses_proto_field_names(run_cgloop):
    out = run_cgloop("telemetry", "pcap", str(need(RTP)), "-f", "json", "--interval-ms", "0")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert rows and {"five_tuple", "packets", "ecn_ce_packets", "size_histogram_bytes"} <= set(
        rows[0]
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "too short for a capture"),
        (b"this is not a capture at all", "not a pcap or pcapng file"),
        (
            bytes.fromhex("d4c3b2a1020004000000000000000000ffff000001000000") + b"\x01\x02",
            "packet 1 at byte offset 24: truncated record header",
        ),
    ],
)
def test_bad_files_are_refused_clearly(tmp_path: Path, content: bytes, message: str):
    bad = tmp_path / "bad.pcap"
    bad.write_bytes(content)
    with pytest.raises(ProbeError, match=message):
        run_pcap(bad)


def test_missing_file_is_named(tmp_path: Path):
    with pytest.raises(ProbeError, match=r"nope\.pcap"):
        run_pcap(tmp_path / "nope.pcap")


# The Python module (cgloop.pcaprecords: training, `cgloop analytics pcap`, importers) and the
# binary run the same twin: identical records, byte for byte, and the same counters.
@pytest.mark.parametrize(
    ("capture", "flags", "kwargs"),
    [
        (SKYPE, ["--interval-ms", "500"], {"interval_ms": 500}),
        (RTP, ["--interval-ms", "0", "--direction", "egress"], {"interval_ms": 0,
                                                               "direction": "egress"}),
        (ZOOM, ["--burst-gap-us", "200", "--idle-timeout-ms", "2000", "--no-rtp"],
         {"burst_gap_us": 200, "idle_timeout_ms": 2000, "rtp": False}),
    ],
)
def test_python_module_gives_the_binarys_records(capture: Path, flags, kwargs):
    result = run_pcap(need(capture), *flags)
    batch, counters = pcaprecords.read(capture, **kwargs)
    ours = FlowRecordBatch.FromString(batch).records
    assert len(ours) == len(result.records) > 0
    assert [r.SerializeToString() for r in ours] == [
        r.SerializeToString() for r in result.records
    ]
    assert counters == result.summary
    # bytes in, the same records out (named like the file, for the default source id)
    again, _ = pcaprecords.read(capture.read_bytes(), name=capture.name, **kwargs)
    assert again == batch


def test_python_module_refuses_what_the_binary_refuses(tmp_path: Path):
    raw = bytes.fromhex("d4c3b2a1020004000000000000000000ffff000001000000")
    raw += bytes(16) + b"\x01\x02"  # a record header announcing 0 bytes, then 2 stray bytes
    bad = tmp_path / "bad.pcap"
    bad.write_bytes(raw)
    with pytest.raises(ProbeError, match="packet 2 at byte offset 40"):
        run_pcap(bad)
    with pytest.raises(pcaprecords.CaptureError, match="packet 2 at byte offset 40") as refused:
        pcaprecords.read(bad)
    assert (refused.value.packet, refused.value.offset) == (2, 40)
    assert isinstance(refused.value, ValueError)
    with pytest.raises(ValueError, match="not a pcap or pcapng file"):
        pcaprecords.read(b"this is not a capture at all")
    with pytest.raises(ValueError, match="direction"):
        pcaprecords.read(raw, direction="sideways")
    with pytest.raises(OSError, match=r"nope\.pcap"):
        pcaprecords.read(tmp_path / "nope.pcap")
