"""nDPI labels (dpi.py, through nfstream) and `cgloop analytics classify` on the real captures of
the lab's data folder, and on damaged ones."""

from __future__ import annotations

import gzip
import json
import struct

import pytest
from cgloop.analytics.classify import NoFlows, classify_capture
from cgloop.analytics.datasets import build_examples, ndpi_flows, synthetic_flows
from cgloop.analytics.dpi import DpiError, dissect, ndpi_class
from cgloop.analytics.evaluate import train
from cgloop.analytics.model import CARD_MEMBER, KEY_ENV, save
from cgloop.analytics.records import CaptureError

from .conftest import need_data
from .test_model import _rewrite, _signed

KEY = "classify-test-key"
# a few captures of the new and the old set: cloud gaming set-up, a game store, video, P2P, a call
FEW = ("geforcenow.pcapng", "steam.pcapng", "dazn.pcapng", "bittorrent_utp.pcap", "zoom2.pcap")


@pytest.fixture(scope="module")
def few_root(tmp_path_factory):
    """A data folder holding only FEW, without nDPI's `.out` files: labels cannot come from
    them."""
    src = need_data("ndpi-pcaps")
    root = tmp_path_factory.mktemp("data")
    (root / "ndpi-pcaps").mkdir()
    for name in FEW:
        (root / "ndpi-pcaps" / name).symlink_to(src / name)
    return root


@pytest.fixture(scope="module")
def tiny_model(few_root):
    """A small model (real flows of FEW and one synthetic session per platform): the command's
    machinery, not the classifier's quality, is under test here."""
    flows = ndpi_flows(few_root) + synthetic_flows(per_platform=1)
    return train(build_examples(flows), n_estimators=20)


@pytest.fixture(scope="module")
def model_file(tiny_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "m.skops"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(KEY_ENV, KEY)
        save(*tiny_model, path)
    return path


def test_ndpi_labels_come_from_ndpi_run_on_the_capture(few_root):
    flows = ndpi_flows(few_root)
    by_capture: dict[str, set[str]] = {}
    for f in flows:
        by_capture.setdefault(f.capture, set()).add(f.label)
    assert by_capture["ndpi/geforcenow"] == {"cloud_gaming"}
    assert "video_streaming" in by_capture["ndpi/dazn"]  # new capture, new application
    assert by_capture["ndpi/bittorrent_utp"] == {"bulk"}
    assert "realtime_call" in by_capture["ndpi/zoom2"]
    assert "online_game" in by_capture["ndpi/steam"] and "web_other" in by_capture["ndpi/steam"]
    gfn = [f for f in flows if f.label == "cloud_gaming"]
    assert {f.platform for f in gfn} == {"gfn"} and len(gfn) == 2
    assert all("GeForceNow" in f.source for f in gfn)


def test_dissect_names_gaming_platforms_and_when_it_knew():
    flows = dissect(need_data("ndpi-pcaps", "geforcenow.pcapng"))
    assert sorted(f.app for f in flows.values()) == ["DTLS.GeForceNow", "TLS.GeForceNow"]
    for f in flows.values():
        assert f.signature() == ("cloud_gaming", "gfn")
        assert f.decision_s is not None and 0 <= f.decision_s < 1.0
    steam = dissect(need_data("ndpi-pcaps", "steam.pcapng"))
    udp = [f for f in steam.values() if f.transport == "UDP" and f.app == "Steam"]
    assert udp and all(f.signature() == ("online_game", "steam") for f in udp)


def test_the_class_table():
    assert ndpi_class("DTLS.GeForceNow", "Game", "UDP") == ("cloud_gaming", "gfn")
    assert ndpi_class("91.189/TLS.Zoom", "Video", "TCP") == ("web_other", "")
    assert ndpi_class("Zoom", "Video", "UDP") == ("realtime_call", "")
    assert ndpi_class("DNS.NetFlix", "Network", "UDP") == ("web_other", "")
    assert ndpi_class("TLS.NetFlix", "Video", "TCP") == ("video_streaming", "")
    assert ndpi_class("Xbox", "Game", "UDP") == ("online_game", "")


def test_dissect_reads_gzip_and_refuses_what_is_no_capture(tmp_path):
    flows = dissect(need_data("l4s-tests", "prague_dualpi2_wifi.pcap.gz"))
    assert any(f.transport == "TCP" and f.packets > 10_000 for f in flows.values())
    bad = tmp_path / "zero.pcap"
    bad.write_bytes(b"\x00" * 64)
    with pytest.raises(DpiError, match=r"zero\.pcap"):
        dissect(bad)
    with pytest.raises(OSError, match=r"missing\.pcap"):
        dissect(tmp_path / "missing.pcap")


def test_classify_signature_when_present_behaviour_otherwise(tiny_model):
    model, card = tiny_model
    gfn = classify_capture(need_data("ndpi-pcaps", "geforcenow.pcapng"), model, card.version)
    assert gfn.share == {"signature": 1.0, "behaviour": 0.0}
    for c in gfn.conversations:
        assert (c.label, c.platform, c.source, c.platform_source) == (
            "cloud_gaming", "gfn", "signature", "signature")
        assert c.confidence == 1.0 and c.decision_s is not None
    zoom = classify_capture(need_data("ndpi-pcaps", "zoom2.pcap"), model)
    assert zoom.share == {"signature": 0.0, "behaviour": 1.0}
    for c in zoom.conversations:
        assert c.source == "behaviour" and 0 < c.confidence <= 1 and c.ndpi_app
        # decided at one of the trained prefixes, or never
        assert c.decision_s in (None, 0.5, 1.0, 2.0, 5.0)
    steam = classify_capture(need_data("ndpi-pcaps", "steam.pcapng"), model)
    assert {(c.label, c.platform) for c in steam.conversations if c.flow.startswith("udp")} == {
        ("online_game", "steam")}


def test_classify_a_gzip_capture(tiny_model):
    rep = classify_capture(need_data("l4s-tests", "cubic_dualpi2_wifi.pcap.gz"), tiny_model[0])
    assert rep.conversations and not rep.dpi_error
    assert max(c.packets for c in rep.conversations) > 10_000


def _pcap(packets: list[bytes]) -> bytes:
    out = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)
    for i, p in enumerate(packets):
        out += struct.pack("<IIII", 1_700_000_000 + i, 0, len(p), len(p)) + p
    return out


def test_one_bad_packet_costs_only_itself(tiny_model, tmp_path):
    raw = bytearray(need_data("ndpi-pcaps", "zoom2.pcap").read_bytes())
    off = 24
    for _ in range(5):  # to the sixth record
        off += 16 + struct.unpack("<I", raw[off + 8 : off + 12])[0]
    raw[off + 16 + 14] = 0x00  # its IP version/IHL byte, after the Ethernet header
    bad = tmp_path / "one-bad-packet.pcap"
    bad.write_bytes(bytes(raw))
    good = classify_capture(need_data("ndpi-pcaps", "zoom2.pcap"), tiny_model[0])
    rep = classify_capture(bad, tiny_model[0])
    assert rep.counters["ip_version_mismatch"] == 1
    assert rep.counters["accounted"] == good.counters["accounted"] - 1
    assert [c.flow for c in rep.conversations] == [c.flow for c in good.conversations]
    assert sum(c.packets for c in rep.conversations) == sum(
        c.packets for c in good.conversations) - 1


def test_classify_refuses_damaged_and_flowless_captures(tiny_model, tmp_path):
    model = tiny_model[0]
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(need_data("ndpi-pcaps", "zoom2.pcap").read_bytes()[:5000])
    with pytest.raises(CaptureError, match=r"cut\.pcap: packet \d+ at byte offset \d+"):
        classify_capture(cut, model)
    empty = tmp_path / "empty.pcap"
    empty.write_bytes(_pcap([]))
    with pytest.raises(NoFlows, match=r"empty\.pcap: no flows"):
        classify_capture(empty, model)
    arp = tmp_path / "arp.pcap"
    arp.write_bytes(_pcap([b"\xff" * 6 + b"\x02" * 6 + b"\x08\x06" + b"\x00" * 28] * 3))
    with pytest.raises(NoFlows, match=r"arp\.pcap: no flows: 3 packets.*\(non_ip 3\)"):
        classify_capture(arp, model)
    cut_gz = tmp_path / "cut.pcap.gz"
    cut_gz.write_bytes(gzip.compress(need_data("ndpi-pcaps", "zoom2.pcap").read_bytes())[:3000])
    with pytest.raises(ValueError, match=r"cut\.pcap\.gz"):
        classify_capture(cut_gz, model)


def test_classify_command_json_table_and_refusals(run_cgloop, model_file, tmp_path):
    env = {KEY_ENV: KEY}
    gfn = need_data("ndpi-pcaps", "geforcenow.pcapng")
    junk = tmp_path / "junk.pcap"
    junk.write_bytes(b"\x00" * 64)
    res = run_cgloop("analytics", "classify", "--json", "--model", str(model_file), str(gfn),
                     str(junk), env=env)
    assert res.returncode == 2, res.stderr
    assert "junk.pcap" in res.stderr and "not a pcap" in " ".join(res.stderr.split())
    (rep,) = json.loads(res.stdout)  # the good capture is still reported
    assert rep["capture"] == str(gfn) and rep["share"]["signature"] == 1.0
    assert {c["label"] for c in rep["conversations"]} == {"cloud_gaming"}
    res = run_cgloop("analytics", "classify", "--model", str(model_file), str(gfn), env=env)
    assert res.returncode == 0, res.stderr
    assert "label source: signature 100%, behaviour 0%" in res.stdout


def test_classify_refuses_a_model_of_another_feature_set(run_cgloop, model_file, tmp_path,
                                                          monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    other = tmp_path / "other-features.skops"

    def edit(name, data):
        if name != CARD_MEMBER:
            return data
        card = json.loads(data)
        _signed(card, features=["dn_bps", "up_pps"])
        return json.dumps(card).encode()

    _rewrite(model_file, other, edit)
    res = run_cgloop("analytics", "classify", "--model", str(other),
                     str(need_data("ndpi-pcaps", "geforcenow.pcapng")), env={KEY_ENV: KEY})
    assert res.returncode == 2
    err = " ".join(res.stderr.split())
    assert "other-features.skops" in err and "model uses features ['dn_bps', 'up_pps']" in err
    res = run_cgloop("analytics", "classify", "--model", str(tmp_path / "none.skops"),
                     str(need_data("ndpi-pcaps", "geforcenow.pcapng")), env={KEY_ENV: KEY})
    assert res.returncode == 2 and "none.skops" in res.stderr
