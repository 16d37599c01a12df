"""Regenerate the seed corpus of the fuzz targets (committed; run by hand after format changes):

    python3 telemetry/int-collector/fuzz/make_corpus.py <path to cgloop-int-collector>

Seeds are report packets from the generator in every format and mode (with drops, congestion and
a path change), plus the INT headers and inner packets cut out of them.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
RUNS = [
    ["--format", "v2.0", "--mode", "md"],
    ["--format", "v2.0", "--mode", "md", "--batch", "4", "--bitmap", "0xffff"],
    ["--format", "v2.0", "--mode", "mx"],
    ["--format", "v1.0"],
    ["--format", "v0.5"],
]
COMMON = ["--flows", "2", "--hops", "3", "--drop-every", "3", "--congestion", "1:2:4"]


def main(binary: str) -> None:
    packets: list[bytes] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, args in enumerate(RUNS):
            out = Path(tmp) / str(i)
            cmd = [binary, "gen", *args, *COMMON, "--path-change-at", "5", "--count", "12"]
            subprocess.run([*cmd, "--out-dir", str(out)], check=True)
            packets += [p.read_bytes() for p in sorted(out.iterdir())]
    corpus = HERE / "corpus"
    for target in ("parse_report", "parse_int", "parse_inner", "state_ingest"):
        (corpus / target).mkdir(parents=True, exist_ok=True)
        for old in (corpus / target).glob("seed-*"):
            old.unlink()
    for i, p in enumerate(packets):
        (corpus / "parse_report" / f"seed-{i:03}").write_bytes(p)
        # Inner packet: first byte selects the type (1 = IPv4); find the IPv4 header 0x45.
        at = max(p.find(b"\x45\x00"), p.find(b"\x45\x5c"))  # DSCP 0 or 0x17
        if at > 0:
            (corpus / "parse_inner" / f"seed-{i:03}").write_bytes(b"\x01" + p[at:])
            shim = at + 20 + 8
            if shim < len(p):
                (corpus / "parse_int" / f"seed-{i:03}").write_bytes(p[shim:])
    # state_ingest: sequences of length-prefixed packets.
    for i in range(0, len(packets), 6):
        seq = b"".join(len(p).to_bytes(2, "big") + p for p in packets[i : i + 6])
        (corpus / "state_ingest" / f"seed-{i:03}").write_bytes(seq)


if __name__ == "__main__":
    main(sys.argv[1])
