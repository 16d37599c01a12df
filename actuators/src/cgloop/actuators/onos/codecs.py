"""What ONOS's JSON codecs accept in a flow's selector and treatment, for the contract server.

Written from ONOS's decoders (opennetworkinglab/onos, core/common/.../codec/impl/
DecodeCriterionCodecHelper, DecodeInstructionCodecHelper; core/api PortNumber.fromString,
TpPort.tpPort, IpPrefix.valueOf) and from the criterion members ONOS publishes in its REST
definitions (`schemas/FlowRules.json`: each member's name and format). It deliberately shares
nothing with the driver's own check (`models.py`, `validation.py`): the contract server must
refuse what ONOS refuses even where the driver has a bug, or their agreement proves nothing.

Where ONOS silently alters a value (DSCP and ECN masked, a protocol cast to a byte) the decoder
does the same; where ONOS throws IllegalArgumentException (ONOS's REST answers 400) it raises
CodecError.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import Any


class CodecError(ValueError):
    """What ONOS's IllegalArgumentException mapper answers with 400."""


# Criterion type -> the member its decoder reads (DecodeCriterionCodecHelper's decoders).
CRITERION_MEMBERS = {
    "IN_PORT": "port",
    "ETH_TYPE": "ethType",
    "IP_DSCP": "ipDscp",
    "IP_ECN": "ipEcn",
    "IP_PROTO": "protocol",
    "IPV4_SRC": "ip",
    "IPV4_DST": "ip",
    "UDP_SRC": "udpPort",
    "UDP_DST": "udpPort",
    "TCP_SRC": "tcpPort",
    "TCP_DST": "tcpPort",
}
# Instruction type -> the member it needs (DecodeInstructionCodecHelper.decode); QUEUE's port is
# optional, OUTPUT's required.
INSTRUCTION_MEMBERS = {
    "OUTPUT": "port",
    "QUEUE": "queueId",
    "METER": "meterId",
    "GROUP": "groupId",
    "NOACTION": None,
}
# PortNumber.Logical, matched by Enum.valueOf: exact, case-sensitive names.
LOGICAL_PORTS = ("IN_PORT", "TABLE", "NORMAL", "FLOOD", "ALL", "LOCAL", "CONTROLLER", "ANY")
_NAMED_PORT = re.compile(r"^\[(?P<name>.*)\]\((?P<num>\d+)\)$")
# Integer ranges of the published formats (a uint16 member is a TpPort, refused past 65535).
FORMAT_RANGES = {"uint16": (0, 0xFFFF)}
U64 = 2**64 - 1


@cache
def published_criterion_members() -> dict[str, str]:
    """Criterion member -> the format (or type) ONOS's definitions give it."""
    text = resources.files("cgloop.actuators.onos").joinpath("schemas/FlowRules.json").read_text()
    flow = json.loads(text)["properties"]["flows"]["items"]
    members = flow["properties"]["selector"]["properties"]["criteria"]["items"]["properties"]
    return {name: spec.get("format", spec["type"]) for name, spec in members.items()}


def _integer(value: Any, member: str) -> int:
    # JSON numbers only: a bool is not one, a float with a fraction neither.
    if isinstance(value, bool) or not isinstance(value, int):
        raise CodecError(f"{member} must be an integer, not {value!r}")
    return value


def _ranged(member: str) -> Callable[[Any], int]:
    low, high = FORMAT_RANGES[published_criterion_members()[member]]

    def decode(value: Any) -> int:
        n = _integer(value, member)
        if not low <= n <= high:  # TpPort.tpPort: checkArgument on the range
            raise CodecError(f"{member} {n} is out of range [{low}, {high}]")
        return n

    return decode


def _masked(member: str, mask: int) -> Callable[[Any], int]:
    return lambda value: _integer(value, member) & mask


def _eth_type(value: Any) -> int:
    # EthTypeDecoder: a number, or a string for Integer.decode ("0x0800", "2048").
    if isinstance(value, str):
        try:
            return int(value, 0) & 0xFFFF
        except ValueError:
            raise CodecError(f"ethType {value!r} is not a number") from None
    return _integer(value, "ethType") & 0xFFFF


def ip_prefix(value: Any) -> str:
    """IpPrefix.valueOf: "address/length", the length in range; host bits are masked."""
    if not isinstance(value, str) or value.count("/") != 1:
        raise CodecError(f"Malformed IP prefix string: {value!r}")
    address, length = value.split("/")
    try:
        ip = ipaddress.IPv4Address(address)
        bits = int(length)
    except ValueError:
        raise CodecError(f"Malformed IP prefix string: {value!r}") from None
    if not 0 <= bits <= 32:
        raise CodecError(f"Invalid prefix length {bits}")
    return str(ipaddress.IPv4Network(f"{ip}/{bits}", strict=False))


def port_number(value: Any) -> str:
    """DecodeInstructionCodecHelper.getPortNumber: a JSON number, or PortNumber.fromString."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value & U64)
    if not isinstance(value, str) or not value:
        raise CodecError(f"Port value {value!r} is not supported")
    if value[0].isascii() and value[0].isdigit():
        # UnsignedLongs.decode: decimal, 0x hex or 0 octal.
        base = 16 if value[:2] in ("0x", "0X") else 8 if value[0] == "0" and len(value) > 1 else 10
        try:
            n = int(value[2:] if base == 16 else value, base)
        except ValueError:
            raise CodecError(f"Invalid port number {value!r}") from None
        if n > U64:
            raise CodecError(f"Port number {value!r} exceeds 64 bits")
        return str(n)
    if value.startswith("["):
        if not _NAMED_PORT.match(value):
            raise CodecError(f"Invalid named PortNumber {value}")
        return value
    if value.startswith("UNKNOWN(") and value.endswith(")"):
        return port_number(value[len("UNKNOWN(") : -1])
    if value not in LOGICAL_PORTS:  # Logical.valueOf
        raise CodecError(f"No enum constant PortNumber.Logical.{value}")
    return value


DECODERS: dict[str, Callable[[Any], Any]] = {
    "IN_PORT": lambda v: _integer(v, "port"),
    "ETH_TYPE": _eth_type,
    "IP_DSCP": _masked("ipDscp", 0x3F),  # IPDscpCriterion masks
    "IP_ECN": _masked("ipEcn", 0x3),  # IPEcnCriterion masks
    "IP_PROTO": _masked("protocol", 0xFF),  # IPProtocolCriterion masks
    "IPV4_SRC": ip_prefix,
    "IPV4_DST": ip_prefix,
    "UDP_SRC": _ranged("udpPort"),
    "UDP_DST": _ranged("udpPort"),
    "TCP_SRC": _ranged("tcpPort"),
    "TCP_DST": _ranged("tcpPort"),
}


def _require(node: Any, member: str, where: str) -> Any:
    # Tools.nullIsIllegal -> IllegalArgumentException -> 400.
    if not isinstance(node, dict):
        raise CodecError(f"{where} must be a JSON object")
    if node.get(member) is None:
        raise CodecError(f"{member} member is required in {where}")
    return node[member]


def decode_criterion(c: Any) -> dict[str, Any]:
    """One criterion as ONOS stores (and encodes) it, or CodecError."""
    kind = _require(c, "type", "Criterion")
    if kind not in DECODERS:
        raise CodecError(f"Type {kind} is unknown")
    member = CRITERION_MEMBERS[kind]
    value = DECODERS[kind](_require(c, member, "Criterion"))
    if kind == "ETH_TYPE":
        value = "0x" + format(value, "x")  # EncodeCriterionCodecHelper writes hex
    return {"type": kind, member: value}


def decode_selector(selector: Any) -> list[dict[str, Any]]:
    if selector is None:
        return []
    criteria = selector.get("criteria") if isinstance(selector, dict) else None
    if criteria is not None and not isinstance(criteria, list):
        raise CodecError("selector criteria must be an array")
    return [decode_criterion(c) for c in criteria or []]


def decode_instruction(i: Any) -> dict[str, Any]:
    kind = _require(i, "type", "Instruction")
    if kind not in INSTRUCTION_MEMBERS:
        raise CodecError(f"Instruction type {kind} is not supported")
    member = INSTRUCTION_MEMBERS[kind]
    out: dict[str, Any] = {"type": kind}
    if member == "port":
        out["port"] = port_number(_require(i, "port", "Instruction"))
    elif member:
        out[member] = _integer(_require(i, member, "Instruction"), member)
        if kind == "QUEUE" and i.get("port") is not None:
            out["port"] = port_number(i["port"])
    return out


def decode_treatment(treatment: Any) -> dict[str, Any]:
    if treatment is None:
        return {"instructions": [], "deferred": []}
    if not isinstance(treatment, dict):
        raise CodecError("treatment must be a JSON object")
    out = {}
    for group in ("instructions", "deferred"):
        items = treatment.get(group) or []
        if not isinstance(items, list):
            raise CodecError(f"treatment {group} must be an array")
        out[group] = [decode_instruction(i) for i in items]
    return out
