"""Action parameters: one typed model per operation, declared once.

The policy loader validates `action.parameters` against these models and the published JSON
Schema is generated from them, so a value is type- and range-checked when a policy is
validated or loaded, not when the agent refuses it mid-incident. Ranges are what the receiving
side takes: the node agent's messages (cgloop.v1 node_agent.proto: uint32 class ids with a
major and a non-zero minor, DSCP 0..63, uint64 rates, uint32 cores and frequencies), the
engine's CALVIN table for chain functions and the ONOS driver's flow-rule limits.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from cgloop.policy.planners.calvin import KNOWN_FUNCTIONS
from cgloop.policy.planners.power import XMAN_MODES
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)

U32 = 0xFFFF_FFFF
U64 = 0xFFFF_FFFF_FFFF_FFFF
ONOS_PRIORITY_MAX = 65535  # FlowRule priority (the ONOS driver's FLOW_PRIORITY_MAX)
ONOS_TIMEOUT_MAX = 2**31 - 1


def _leaf_handle(value: int) -> int:
    # tc handles are MAJOR:MINOR in 16 bits each; the agent needs both (1:10 = 0x00010010).
    if value >> 16 == 0 or value & 0xFFFF == 0:
        raise ValueError(
            f"class_id {value:#010x} needs a major and a non-zero minor, e.g. 1:10 = 0x00010010"
        )
    return value


ClassId = Annotated[
    int,
    Field(ge=1, le=U32, description="HTB class handle MAJOR:MINOR as 0xMMMMmmmm"),
    AfterValidator(_leaf_handle),
]
Dscp = Annotated[int, Field(ge=0, le=63)]
Bps = Annotated[int, Field(ge=1, le=U64, description="bits per second")]
Core = Annotated[int, Field(ge=0, le=U32)]
Khz = Annotated[int, Field(ge=1, le=U32)]
Port = Annotated[
    int | Annotated[str, Field(pattern=r"^[A-Z_]+$|^[0-9]+$")],
    Field(description="switch port number or ONOS logical port (CONTROLLER, NORMAL, …)"),
]
_FUNCTION = re.compile(r"^([a-z_]+)(?::([0-9]+(?:\.[0-9]+)?))?$")


def _known_function(item: str) -> str:
    name = _FUNCTION.match(item).group(1)  # type: ignore[union-attr]  # pattern checked first
    if name not in KNOWN_FUNCTIONS:
        raise ValueError(f"{name!r} is not in the CALVIN table ({', '.join(KNOWN_FUNCTIONS)})")
    return item


ChainFunction = Annotated[
    str,
    Field(pattern=_FUNCTION.pattern),
    AfterValidator(_known_function),
    # The schema spells the names out; the loader says which name is unknown.
    WithJsonSchema(
        {
            "type": "string",
            "pattern": rf"^({'|'.join(KNOWN_FUNCTIONS)})(:[0-9]+(\.[0-9]+)?)?$",
            "description": "CALVIN function name, optionally :processing_us (network_coding:7)",
        }
    ),
]


class Parameters(BaseModel):
    # strict: "46" is not a DSCP, true is not a class id, 5.0 is not a rate.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ReprioritiseFlowParameters(Parameters):
    class_id: ClassId
    rewrite_dscp: Dscp | None = None


class SetClassRateParameters(Parameters):
    class_id: ClassId
    rate_bps: Bps
    ceil_bps: Bps | None = None

    @model_validator(mode="after")
    def _ceil_not_below_rate(self) -> SetClassRateParameters:
        if self.ceil_bps is not None and self.ceil_bps < self.rate_bps:
            raise ValueError(f"ceil_bps {self.ceil_bps} is below rate_bps {self.rate_bps}")
        return self


class SetChainParameters(Parameters):
    chain_id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    traffic_class: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    functions: list[ChainFunction] = Field(min_length=1)
    base_rtt_us: float = Field(default=0, ge=0)
    free_cores: list[Core] = Field(default_factory=list)


class SetPowerPolicyParameters(Parameters):
    cores: list[Core] = Field(min_length=1)
    min_frequency_khz: Khz
    max_frequency_khz: Khz
    governor: str | None = Field(default=None, pattern=r"^[a-z0-9_]+$")
    xman_mode: Literal[tuple(XMAN_MODES)] = "load"  # type: ignore[valid-type]
    latency_critical: list[Core] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> SetPowerPolicyParameters:
        if self.min_frequency_khz > self.max_frequency_khz:
            raise ValueError(
                f"min_frequency_khz {self.min_frequency_khz} is above max_frequency_khz "
                f"{self.max_frequency_khz}"
            )
        stray = sorted(set(self.latency_critical) - set(self.cores))
        if stray:
            raise ValueError(f"latency_critical cores {stray} are not among cores")
        return self


class OnosFlowRuleParameters(Parameters):
    priority: int = Field(ge=0, le=ONOS_PRIORITY_MAX)
    queue_id: int | None = Field(default=None, ge=0, le=U32)
    output_port: Port | None = None
    timeout_s: int = Field(default=0, ge=0, le=ONOS_TIMEOUT_MAX)
    app_id: str | None = Field(default=None, min_length=1)


class OnosQueueParameters(Parameters):
    port: Port
    queue_id: int = Field(ge=0, le=U32)
    min_rate_bps: Bps | None = None
    max_rate_bps: Bps | None = None
    priority: int | None = Field(default=None, ge=0, le=U32)


class NotifyParameters(Parameters):
    message: str | None = None


# Keyed by cgloop.policy.model.Operation values (kept as strings here to avoid an import cycle).
BY_OPERATION: dict[str, type[Parameters]] = {
    "reprioritise_flow": ReprioritiseFlowParameters,
    "set_class_rate": SetClassRateParameters,
    "set_chain": SetChainParameters,
    "set_power_policy": SetPowerPolicyParameters,
    "onos_flow_rule": OnosFlowRuleParameters,
    "onos_queue": OnosQueueParameters,
    "notify": NotifyParameters,
}
