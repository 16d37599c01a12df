"""Reading detections: subject keys, enum names, label lookups (cgloop.v1.Detection)."""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from cgloop.policy.model import Kind, Severity, Subject
from cgloop.v1 import detection_pb2 as dpb
from cgloop.v1.common_pb2 import FiveTuple

_KIND_VALUES = {k.value for k in Kind}
# Kinds added to the proto after this build's policy schema are matched by no policy.
_KINDS = {
    number: Kind(name.removeprefix("DETECTION_KIND_").lower())
    for name, number in dpb.DetectionKind.items()
    if name.removeprefix("DETECTION_KIND_").lower() in _KIND_VALUES
}


def kind_of(det: dpb.Detection) -> Kind | None:
    return _KINDS.get(det.kind)


def severity_rank(det: dpb.Detection) -> int:
    return int(det.severity)


def severity_of(det: dpb.Detection) -> Severity | None:
    return list(Severity)[det.severity - 1] if 1 <= det.severity <= len(Severity) else None


def subject_of(det: dpb.Detection) -> Subject | None:
    which = det.WhichOneof("subject")
    return {
        "flow": Subject.FLOW,
        "queue": Subject.QUEUE,
        "node_id": Subject.NODE,
        "function_name": Subject.FUNCTION,
        "link": Subject.LINK,
    }.get(which or "")


@lru_cache(maxsize=65_536)
def addr_text(raw: bytes) -> str:
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        return raw.hex() or "-"


def flow_text(ft: FiveTuple) -> str:
    return (
        f"{addr_text(ft.src_addr)}:{ft.src_port}>{addr_text(ft.dst_addr)}:{ft.dst_port}"
        f"/{ft.ip_protocol}"
    )


def subject_key(det: dpb.Detection) -> str:
    """Stable text of what a detection is about, e.g. 'flow:10.0.0.1:5004>10.0.0.2:40000/17'."""
    which = det.WhichOneof("subject")
    if which == "flow":
        return "flow:" + flow_text(det.flow)
    if which == "queue":
        q = det.queue
        return f"queue:{q.node_id}/{q.interface_name}/{q.queue_id}"
    if which == "node_id":
        return f"node:{det.node_id}"
    if which == "function_name":
        # The same function on two nodes is two subjects (their holds and triggers apart);
        # instances of one function on a node are one: a scale-out acts on them together.
        node = det.labels.get("node_id", "")
        return f"function:{node}/{det.function_name}" if node else f"function:{det.function_name}"
    if which == "link":
        lk = det.link
        return f"link:{lk.src_device_id}/{lk.src_port}>{lk.dst_device_id}/{lk.dst_port}"
    return "none"


def subject_value(det: dpb.Detection) -> str:
    """What `{subject}` expands to in a policy target: the node id, queue node, function name."""
    which = det.WhichOneof("subject")
    if which == "node_id":
        return det.node_id
    if which == "queue":
        return det.queue.node_id
    if which == "function_name":
        return det.function_name
    if which == "link":
        return det.link.src_device_id
    return subject_key(det)
