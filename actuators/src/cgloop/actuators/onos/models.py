"""Request and response models of the ONOS REST API.

The field names and the rules come from ONOS's JSON codecs (opennetworkinglab/onos,
core/common/src/main/java/org/onosproject/codec/impl/): each class names the codec it mirrors.
Where a codec silently alters a value (DSCP and ECN are masked, a group id is truncated to an
int), the model refuses the value instead, so what ONOS installs is what we asked for.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_serializer,
    field_validator,
    model_validator,
)

UINT32_MAX = 0xFFFF_FFFF
# OpenFlow 1.3 OFPM_MAX: the last usable meter id (ONOS's MeterId takes a long).
METER_ID_MAX = 0xFFFF_0000
# FlowRule.MIN_PRIORITY / MAX_PRIORITY (core/api …/flow/FlowRule.java).
FLOW_PRIORITY_MAX = 65535
# Intent.MIN_PRIORITY / MAX_PRIORITY (core/api …/intent/Intent.java).
INTENT_PRIORITY_MIN = 1
INTENT_PRIORITY_MAX = 65535
ETH_TYPE_IPV4 = 0x0800
ETH_TYPE_IPV6 = 0x86DD
IP_PROTO_TCP = 6
IP_PROTO_UDP = 17
# PortNumber.fromString: a number or one of the logical port names.
LOGICAL_PORTS = frozenset(
    {"IN_PORT", "TABLE", "NORMAL", "FLOOD", "ALL", "CONTROLLER", "LOCAL", "ANY"}
)
# DeviceId.deviceId(String) parses a URI: it needs a scheme ("of:", "device:", …).
DEVICE_ID = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:\S+$")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def _device_id(value: str) -> str:
    if not DEVICE_ID.match(value):
        raise ValueError(f"device id {value!r} is not a URI such as 'of:0000000000000001'")
    return value


def _port(value: str | int) -> str:
    text = str(value)
    if text.isdigit():
        if int(text) > UINT32_MAX:
            raise ValueError(f"port {text} exceeds 32 bits")
        return text
    if text.upper() in LOGICAL_PORTS:
        return text.upper()
    raise ValueError(f"port {text!r} is neither a number nor one of {sorted(LOGICAL_PORTS)}")


DeviceId = Annotated[str, AfterValidator(_device_id)]
PortName = Annotated[str, BeforeValidator(_port)]


# --- criteria (CriterionCodec field names; DecodeCriterionCodecHelper rules) ---------------------


class EthTypeCriterion(_Model):
    """EthTypeDecoder: a number or a string for Integer.decode ("0x0800")."""

    type: Literal["ETH_TYPE"] = "ETH_TYPE"
    eth_type: int = Field(alias="ethType", ge=0, le=0xFFFF)

    @field_validator("eth_type", mode="before")
    @classmethod
    def _decode(cls, v: Any) -> Any:
        # ONOS encodes it as "0x800" (EncodeCriterionCodecHelper); accept what it sends back.
        return int(v, 0) if isinstance(v, str) else v

    @field_serializer("eth_type")
    def _hex(self, v: int) -> str:
        return f"0x{v:04x}"


class IpProtoCriterion(_Model):
    type: Literal["IP_PROTO"] = "IP_PROTO"
    protocol: int = Field(ge=0, le=255)


class IpDscpCriterion(_Model):
    """IpDscpDecoder casts to byte and IPDscpCriterion masks with 0x3f: refuse > 63 instead."""

    type: Literal["IP_DSCP"] = "IP_DSCP"
    ip_dscp: int = Field(alias="ipDscp", ge=0, le=63)


class IpEcnCriterion(_Model):
    """IpEcnDecoder; IPEcnCriterion masks with 0x3."""

    type: Literal["IP_ECN"] = "IP_ECN"
    ip_ecn: int = Field(alias="ipEcn", ge=0, le=3)


class _IpPrefix(_Model):
    ip: str

    @field_validator("ip")
    @classmethod
    def _prefix(cls, v: str) -> str:
        # IpPrefix.valueOf needs "a.b.c.d/len"; a bare address is made a /32 explicitly.
        net = ipaddress.ip_network(v if "/" in v else f"{v}/32", strict=True)
        if net.version != 4:
            raise ValueError(f"{v} is not an IPv4 prefix")
        return str(net)


class Ipv4SrcCriterion(_IpPrefix):
    type: Literal["IPV4_SRC"] = "IPV4_SRC"


class Ipv4DstCriterion(_IpPrefix):
    type: Literal["IPV4_DST"] = "IPV4_DST"


class UdpSrcCriterion(_Model):
    type: Literal["UDP_SRC"] = "UDP_SRC"
    udp_port: int = Field(alias="udpPort", ge=0, le=65535)


class UdpDstCriterion(_Model):
    type: Literal["UDP_DST"] = "UDP_DST"
    udp_port: int = Field(alias="udpPort", ge=0, le=65535)


class TcpSrcCriterion(_Model):
    type: Literal["TCP_SRC"] = "TCP_SRC"
    tcp_port: int = Field(alias="tcpPort", ge=0, le=65535)


class TcpDstCriterion(_Model):
    type: Literal["TCP_DST"] = "TCP_DST"
    tcp_port: int = Field(alias="tcpPort", ge=0, le=65535)


class InPortCriterion(_Model):
    """InPortDecoder reads the port with asLong(): it must be a number here."""

    type: Literal["IN_PORT"] = "IN_PORT"
    port: int = Field(ge=0, le=UINT32_MAX)


Criterion = Annotated[
    EthTypeCriterion
    | IpProtoCriterion
    | IpDscpCriterion
    | IpEcnCriterion
    | Ipv4SrcCriterion
    | Ipv4DstCriterion
    | UdpSrcCriterion
    | UdpDstCriterion
    | TcpSrcCriterion
    | TcpDstCriterion
    | InPortCriterion,
    Field(discriminator="type"),
]


class Selector(_Model):
    """TrafficSelectorCodec: {"criteria": [...]}.

    Also enforced: OpenFlow match prerequisites (OF 1.3 §7.2.3.8), which ONOS checks only when
    the rule reaches the switch: IP fields need ETH_TYPE IPv4/IPv6, ports need IP_PROTO.
    """

    criteria: list[Criterion] = Field(default_factory=list)

    @model_validator(mode="after")
    def _prerequisites(self) -> Selector:
        by_type = {c.type: c for c in self.criteria}
        if len(by_type) != len(self.criteria):
            raise ValueError("a criterion type appears twice in the selector")
        eth = by_type.get("ETH_TYPE")
        ip_types = {"IP_DSCP", "IP_ECN", "IP_PROTO", "IPV4_SRC", "IPV4_DST"}
        eth_ok = isinstance(eth, EthTypeCriterion) and eth.eth_type in (
            ETH_TYPE_IPV4,
            ETH_TYPE_IPV6,
        )
        if ip_types & by_type.keys() and not eth_ok:
            raise ValueError("IP criteria need an ETH_TYPE criterion of 0x0800 or 0x86dd")
        proto = by_type.get("IP_PROTO")
        for kind, number in (("UDP", IP_PROTO_UDP), ("TCP", IP_PROTO_TCP)):
            proto_ok = isinstance(proto, IpProtoCriterion) and proto.protocol == number
            if {f"{kind}_SRC", f"{kind}_DST"} & by_type.keys() and not proto_ok:
                raise ValueError(f"{kind} port criteria need IP_PROTO {number}")
        return self


# --- instructions (InstructionCodec field names; DecodeInstructionCodecHelper.decode) -----------


class OutputInstruction(_Model):
    """OUTPUT: `port` is required (getPortNumber: a number or a logical name)."""

    type: Literal["OUTPUT"] = "OUTPUT"
    port: PortName


class QueueInstruction(_Model):
    """QUEUE: `queueId` (asLong) required, `port` optional."""

    type: Literal["QUEUE"] = "QUEUE"
    queue_id: int = Field(alias="queueId", ge=0, le=UINT32_MAX)
    port: PortName | None = None


class MeterInstruction(_Model):
    """METER: `meterId` (asLong) required."""

    type: Literal["METER"] = "METER"
    meter_id: int = Field(alias="meterId", ge=1, le=METER_ID_MAX)


class GroupInstruction(_Model):
    """GROUP: `groupId` is read asLong() then intValue(): it must fit in 32 bits unsigned."""

    type: Literal["GROUP"] = "GROUP"
    group_id: int = Field(alias="groupId", ge=0, le=UINT32_MAX)


Instruction = Annotated[
    OutputInstruction | QueueInstruction | MeterInstruction | GroupInstruction,
    Field(discriminator="type"),
]


class Treatment(_Model):
    """TrafficTreatmentCodec: immediate `instructions` and `deferred` ones (always sent, since
    the published schema requires both)."""

    instructions: list[Instruction] = Field(default_factory=list)
    deferred: list[Instruction] = Field(default_factory=list)

    @model_validator(mode="after")
    def _single(self) -> Treatment:
        for kind in ("METER", "GROUP"):
            if sum(1 for i in self.instructions if i.type == kind) > 1:
                raise ValueError(f"at most one {kind} instruction per treatment")
        return self


# --- flow rules (FlowRuleCodec) -----------------------------------------------------------------


class FlowRule(_Model):
    """FlowRuleCodec.decode: `priority`, `isPermanent` and `deviceId` are required; `timeout` is
    required when the flow is temporary; `tableId` is an int (or a PI table name); `appId` is
    an application *name* (ONOS registers it)."""

    priority: int = Field(ge=0, le=FLOW_PRIORITY_MAX)
    timeout: int = Field(default=0, ge=0, le=2**31 - 1)
    is_permanent: bool = Field(default=True, alias="isPermanent")
    device_id: DeviceId = Field(alias="deviceId")
    table_id: int = Field(default=0, alias="tableId", ge=0, le=255)
    app_id: str | None = Field(default=None, alias="appId")
    treatment: Treatment = Field(default_factory=Treatment)
    selector: Selector = Field(default_factory=Selector)

    @model_validator(mode="after")
    def _timeout(self) -> FlowRule:
        # Ours: a temporary flow with a 0 s timeout would never expire; ask for permanent.
        if not self.is_permanent and self.timeout == 0:
            raise ValueError("a temporary flow (isPermanent false) needs timeout > 0 s")
        if self.is_permanent and self.timeout != 0:
            raise ValueError("a permanent flow must have timeout 0")
        return self

    def identity(self) -> tuple[str, int, int, frozenset[str]]:
        """What makes two flows the same entry in ONOS's flow table: device, priority, table and
        match (DefaultFlowRule.equals / computeFlowId hash the same fields)."""
        criteria = frozenset(repr(sorted(c.to_json().items())) for c in self.selector.criteria)
        return (self.device_id, self.priority, self.table_id, criteria)


# --- meters (MeterRequestCodec, MeterBandCodec) --------------------------------------------------


class Band(_Model):
    """MeterBandCodec.decode: `rate`, `burstSize`, `type` required; `prec` for REMARK. The
    published schema requires `prec` on every band; the codec ignores it unless REMARK, so the
    driver always sends it (0 by default)."""

    type: Literal["DROP", "REMARK", "NONE", "MARK_YELLOW", "MARK_RED"]
    rate: int = Field(ge=1)
    burst_size: int = Field(default=0, alias="burstSize", ge=0)
    prec: int = Field(default=0, ge=0, le=255)


class MeterRequest(_Model):
    """MeterRequestCodec.decode: `deviceId`, `unit` (KB_PER_SEC or PKTS_PER_SEC) and `bands`
    required; `burst` optional (the schema requires it, so it is always sent). ONOS files the
    meter under its REST application id whatever we send."""

    device_id: DeviceId = Field(alias="deviceId")
    unit: Literal["KB_PER_SEC", "PKTS_PER_SEC"]
    burst: bool = False
    bands: list[Band] = Field(min_length=1)

    @model_validator(mode="after")
    def _burst(self) -> MeterRequest:
        if not self.burst and any(b.burst_size for b in self.bands):
            raise ValueError("band burstSize is only applied with burst true")
        return self


# --- intents (IntentCodec, ConnectivityIntentCodec, PointToPointIntentCodec) --------------------


class ConnectPoint(_Model):
    """ConnectPointCodec: {"device": id, "port": number-as-string}."""

    device: DeviceId
    port: str

    @field_validator("port", mode="before")
    @classmethod
    def _p(cls, v: Any) -> str:
        text = str(v)
        if not text.isdigit():
            raise ValueError(f"connect point port {text!r} must be a port number")
        return _port(text)


class PointToPointIntent(_Model):
    """IntentCodec.intentAttributes: `appId` must name a *registered* application (else 404);
    PointToPointIntentCodec: `ingressPoint` and `egressPoint` required."""

    type: Literal["PointToPointIntent"] = "PointToPointIntent"
    app_id: str = Field(alias="appId", min_length=1)
    priority: int = Field(default=100, ge=INTENT_PRIORITY_MIN, le=INTENT_PRIORITY_MAX)
    ingress_point: ConnectPoint = Field(alias="ingressPoint")
    egress_point: ConnectPoint = Field(alias="egressPoint")
    selector: Selector = Field(default_factory=Selector)
    treatment: Treatment = Field(default_factory=Treatment)

    @model_validator(mode="after")
    def _distinct(self) -> PointToPointIntent:
        if self.ingress_point == self.egress_point:
            raise ValueError("ingress and egress points are the same")
        return self


# --- reads (lenient: ONOS adds fields between releases) -----------------------------------------


class _Read(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class Device(_Read):
    id: str
    type: str | None = None
    available: bool | None = None
    role: str | None = None
    driver: str | None = None


class Port(_Read):
    port: str
    is_enabled: bool | None = Field(default=None, alias="isEnabled")
    type: str | None = None
    port_speed: int | None = Field(default=None, alias="portSpeed")

    @field_validator("port", mode="before")
    @classmethod
    def _s(cls, v: Any) -> str:
        return str(v)


class HostLocation(_Read):
    element_id: str = Field(alias="elementId")
    port: str

    @field_validator("port", mode="before")
    @classmethod
    def _s(cls, v: Any) -> str:
        return str(v)


class Host(_Read):
    id: str
    mac: str
    vlan: str | None = None
    ip_addresses: list[str] = Field(default_factory=list, alias="ipAddresses")
    locations: list[HostLocation] = Field(default_factory=list)


class LinkEnd(_Read):
    device: str
    port: str

    @field_validator("port", mode="before")
    @classmethod
    def _s(cls, v: Any) -> str:
        return str(v)


class Link(_Read):
    src: LinkEnd
    dst: LinkEnd
    type: str | None = None
    state: str | None = None
