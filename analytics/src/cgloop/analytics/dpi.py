"""Application labels from a real DPI library: nDPI, through the `nfstream` package (PyPI, which
bundles libnDPI; LGPL-3.0).

Two uses, one table:

* **labels** for training and evaluation: every conversation of a real capture gets the class
  its nDPI application maps to (`ndpi_class`), instead of parsing the `.out` files nDPI's own
  test suite ships beside its pcaps;
* **the signature path** of `cgloop analytics classify`: where nDPI names a gaming platform
  (GeForce Now, Xbox, PlayStation, Steam, …: `PLATFORMS`) from a flow's set-up, that name is
  the flow's platform and, where it settles the class, its label; otherwise the behavioural
  model (features of the probe's records) decides.

nDPI sees packets, not records: it is run on the capture file itself. The records the model
reads still come from the probe's own code (the Rust pcap twin, `records.py`); conversations
are matched by their 5-tuple (`records.conversation_key`).
"""

from __future__ import annotations

import gzip
import ipaddress
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cgloop.analytics.records import TupleKey, conversation_key
from cgloop.v1.common_pb2 import FiveTuple

# ---------------------------------------------------------------- nDPI application → class

# nDPI protocol names (the last part of e.g. "TLS.Zoom", "STUN.WhatsAppCall").
_CONTROL = {"DNS", "MDNS", "SSDP", "NetBIOS", "DHCP", "ICMP", "ICMPV6", "LLMNR", "NTP", "IGMP"}
_CALL = {
    "Zoom", "Skype_TeamsCall", "TeamsCall", "Teams", "Webex", "WhatsAppCall", "TelegramVoip",
    "Discord", "RTP", "SRTP", "SIP", "RTCP", "GoogleMeet", "GoogleCall", "FaceTime", "Signal",
    "SignalVoip", "TeamSpeak", "WeChat",
}
_STREAM = {
    "NetFlix", "YouTube", "AmazonVideo", "Twitch", "DisneyPlus", "Dazn", "MpegDash", "RTSP",
}
_GAME = {
    "Nintendo", "RakNet", "Roblox", "Starcraft", "Blizzard", "Steam", "SteamDatagramRelay",
    "Dota2", "Xbox", "Playstation", "EpicGames", "RiotGames", "NetEaseGames", "AmongUs",
}
_BULK = {"BitTorrent", "YouTubeUpload"}

# Gaming platforms nDPI recognises from a flow's set-up: app → (platform, settles the class).
# GeForce Now is a cloud-gaming service only; Xbox and PlayStation run both online games and
# cloud gaming (xCloud, PlayStation Plus streaming), so there nDPI names the platform and the
# behavioural model decides the class; the others are game stores/servers (online_game on UDP,
# their TLS/HTTP flows are web traffic, as `ndpi_class` says).
PLATFORMS: dict[str, tuple[str, bool]] = {
    "GeForceNow": ("gfn", True),
    "Xbox": ("xc", False),
    "Playstation": ("psn", False),
    "Steam": ("steam", True),
    "SteamDatagramRelay": ("steam", True),
    "Dota2": ("steam", True),
    "Nintendo": ("nintendo", True),
    "EpicGames": ("epic", True),
    "RiotGames": ("riot", True),
    "Roblox": ("roblox", True),
    "Blizzard": ("blizzard", True),
    "Starcraft": ("blizzard", True),
    "NetEaseGames": ("netease", True),
    "AmongUs": ("amongus", True),
}


def app_names(proto: str) -> tuple[str, str]:
    """(master, app) of an nDPI protocol name: "TLS.Zoom" → (TLS, Zoom); "91.189/TLS.Zoom"
    (nDPI's numeric form) alike; "Zoom" → (Zoom, Zoom)."""
    names = proto.split("/", 1)[-1].split(".")
    return names[0], names[-1]


def ndpi_class(proto: str, category: str, transport: str) -> tuple[str, str]:
    """(class, platform) for nDPI's application `proto` (e.g. "TLS.Zoom"), its category and
    the transport ("TCP"/"UDP"). Signalling and web flows of any application are web_other;
    calls and games only on UDP (their TCP flows are sign-in, stores, chat)."""
    master, app = app_names(proto)
    if master in _CONTROL or "GTP" in proto:
        return "web_other", ""
    if app == "GeForceNow":
        return "cloud_gaming", "gfn"
    if app in _STREAM or (transport == "TCP" and category == "Streaming"):
        return "video_streaming", ""
    if app in _BULK:
        return "bulk", ""
    if transport == "UDP" or app == "RTP":
        if app in _CALL or category in ("VoIP", "Video"):
            return "realtime_call", ""
        if app in _GAME or category == "Game":
            return "online_game", ""
    return "web_other", ""


# ---------------------------------------------------------------- running nDPI


class DpiError(ValueError):
    """nDPI (nfstream) could not read a capture; the text names the file."""


@dataclass
class DpiFlow:
    """nDPI's verdict on one conversation of a capture."""

    key: TupleKey  # records.conversation_key
    transport: str  # "TCP", "UDP" or the IP protocol number
    app: str  # nDPI application, e.g. "DTLS.GeForceNow"; "Unknown" when it found none
    category: str
    guessed: bool  # nDPI guessed from ports/addresses, it did not dissect the application
    first_ns: int
    decided_ns: int | None  # the packet after which nDPI named the application (not guessed)
    packets: int
    server_name: str = ""

    @property
    def identified(self) -> bool:
        return bool(self.app) and self.app != "Unknown" and not self.guessed

    @property
    def decision_s(self) -> float | None:
        if self.decided_ns is None:
            return None
        return (self.decided_ns - self.first_ns) / 1e9

    def label(self) -> tuple[str, str]:
        """(class, platform) of the conversation from nDPI's application (`ndpi_class`)."""
        return ndpi_class(self.app, self.category, self.transport)

    def signature(self) -> tuple[str, str] | None:
        """(class or "" when nDPI leaves the class to behaviour, platform) when nDPI identified
        a gaming platform (`PLATFORMS`), else None."""
        if not self.identified:
            return None
        hit = PLATFORMS.get(app_names(self.app)[1])
        if hit is None:
            return None
        platform, settles = hit
        return (self.label()[0] if settles else "", platform)


@contextmanager
def _libpcap_readable(path: Path) -> Iterator[Path]:
    """libpcap (under nfstream) reads no gzip: a .gz capture is decompressed to a temporary
    file first."""
    with path.open("rb") as fh:
        magic = fh.read(2)
    if magic != b"\x1f\x8b":
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="cgloop-dpi-") as tmp:
        plain = Path(tmp) / path.name.removesuffix(".gz")
        try:
            with gzip.open(path, "rb") as src, plain.open("wb") as dst:
                shutil.copyfileobj(src, dst)
        except (OSError, EOFError) as exc:
            raise DpiError(f"{path}: damaged gzip stream: {exc}") from exc
        yield plain


def _packed(text: str) -> bytes:
    return ipaddress.ip_address(text).packed


def dissect(capture: str | os.PathLike[str]) -> dict[TupleKey, DpiFlow]:
    """nDPI's application per conversation of a capture (pcap, pcapng, gzip), keyed like the
    probe's records. Raises DpiError naming the file when nDPI cannot read it; OSError when
    the file cannot be opened."""
    from nfstream import NFPlugin, NFStreamer

    class _Decided(NFPlugin):
        """Records the capture time of the packet after which nDPI named the application."""

        def on_init(self, packet, flow):
            flow.udps.decided_ms = None
            self.on_update(packet, flow)

        def on_update(self, packet, flow):
            if (flow.udps.decided_ms is None and flow.application_name
                    and flow.application_name != "Unknown" and not flow.application_is_guessed):
                flow.udps.decided_ms = packet.time

    path = Path(capture)
    if not path.is_file():
        raise OSError(f"{path}: no such capture file")
    out: dict[TupleKey, DpiFlow] = {}
    with _libpcap_readable(path) as readable:
        try:
            streamer = NFStreamer(
                source=str(readable), n_dissections=255, statistical_analysis=False,
                n_meters=1, decode_tunnels=True, udps=[_Decided()],
            )
            flows = list(streamer)
        except ValueError as exc:
            raise DpiError(f"{path}: nDPI (nfstream) cannot read it: {exc}") from exc
    for f in flows:
        if f.protocol not in (6, 17):
            continue
        try:
            ft = FiveTuple(src_addr=_packed(f.src_ip), dst_addr=_packed(f.dst_ip),
                           src_port=f.src_port, dst_port=f.dst_port, ip_protocol=f.protocol)
        except ValueError:
            continue  # an address nDPI printed that is no IP address: that flow only
        key = conversation_key(ft)
        decided = f.udps.decided_ms
        flow = DpiFlow(
            key=key, transport={6: "TCP", 17: "UDP"}[f.protocol],
            app=f.application_name or "Unknown", category=f.application_category_name or "",
            guessed=bool(f.application_is_guessed), first_ns=f.bidirectional_first_seen_ms * 10**6,
            decided_ns=None if decided is None else decided * 10**6,
            packets=f.bidirectional_packets, server_name=f.requested_server_name or "",
        )
        prev = out.get(key)
        if prev is None:
            out[key] = flow
        else:  # the same conversation split by nDPI's timeouts: its first identified part
            keep = prev if prev.identified or not flow.identified else flow
            keep.packets = prev.packets + flow.packets
            keep.first_ns = min(prev.first_ns, flow.first_ns)
            out[key] = keep
    return out
