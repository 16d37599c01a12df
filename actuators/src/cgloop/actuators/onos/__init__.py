"""ONOS driver: flow rules, intents, meters and topology reads over ONOS's REST API.

Every request body is built from pydantic models that encode the rules of ONOS's JSON codecs
(core/common/src/main/java/org/onosproject/codec/impl/) and is validated against ONOS's published
REST definitions before it is sent. See docs/onos-driver.md.
"""

from cgloop.actuators.onos.client import FlowRef, OnosClient, OnosSettings
from cgloop.actuators.onos.errors import (
    OnosError,
    OnosRequestError,
    OnosServerError,
    OnosUnavailableError,
    OnosValidationError,
)
from cgloop.actuators.onos.models import (
    Band,
    ConnectPoint,
    EthTypeCriterion,
    FlowRule,
    GroupInstruction,
    InPortCriterion,
    IpDscpCriterion,
    IpEcnCriterion,
    IpProtoCriterion,
    Ipv4DstCriterion,
    Ipv4SrcCriterion,
    MeterInstruction,
    MeterRequest,
    OutputInstruction,
    PointToPointIntent,
    QueueInstruction,
    Selector,
    TcpDstCriterion,
    TcpSrcCriterion,
    Treatment,
    UdpDstCriterion,
    UdpSrcCriterion,
)

__all__ = [
    "Band",
    "ConnectPoint",
    "EthTypeCriterion",
    "FlowRef",
    "FlowRule",
    "GroupInstruction",
    "InPortCriterion",
    "IpDscpCriterion",
    "IpEcnCriterion",
    "IpProtoCriterion",
    "Ipv4DstCriterion",
    "Ipv4SrcCriterion",
    "MeterInstruction",
    "MeterRequest",
    "OnosClient",
    "OnosError",
    "OnosRequestError",
    "OnosServerError",
    "OnosSettings",
    "OnosUnavailableError",
    "OnosValidationError",
    "OutputInstruction",
    "PointToPointIntent",
    "QueueInstruction",
    "Selector",
    "TcpDstCriterion",
    "TcpSrcCriterion",
    "Treatment",
    "UdpDstCriterion",
    "UdpSrcCriterion",
]
