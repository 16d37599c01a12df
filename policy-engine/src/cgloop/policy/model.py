"""Policies: the YAML a NOC writes, validated by pydantic against the published JSON Schema.

A policy file holds one policy (a mapping with `id`) or several (`policies: [...]`). Errors
name the file, the line and the field (`PolicyError`), so a bad policy is rejected with a
message an operator can act on; a directory of policies is loaded as one set with unique ids.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import yaml
from cgloop import slo
from cgloop.policy import parameters
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ns|us|µs|ms|s|m|h)\s*$")


def _seconds(value: Any) -> Any:
    if isinstance(value, str):
        m = _DURATION.match(value)
        if not m:
            raise ValueError(f"{value!r} is not a duration like 250ms, 2s, 1m")
        return float(m.group(1)) * _UNITS[m.group(2)]
    return value


# Durations are written "250ms", "2s", "1m" (or a number of seconds) and held in seconds.
Duration = Annotated[
    float,
    BeforeValidator(_seconds),
    Field(ge=0),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": _DURATION.pattern},
                {"type": "number", "minimum": 0},
            ],
            "description": "a duration: 250ms, 2s, 1m, or a number of seconds",
        }
    ),
]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# cgloop.v1.ActionOperation, named like the members of Action.spec (reprioritise_flow ...):
# the operations a policy can order are the ones the contract has a message for, but for those
# only a node agent records (parameters.NODE_ONLY).
Operation = StrEnum(  # type: ignore[misc]
    "Operation", {name.upper(): name for name in parameters.ORDERABLE}
)


class Level(StrEnum):
    MICRO = "micro"  # executed by the node agent directly (MOSAICO §3.2)
    GLOBAL = "global"  # placement, chains across nodes, ONOS


class Mode(StrEnum):
    ENFORCE = "enforce"
    DRY_RUN = "dry_run"  # decide and record, change nothing (actuators get dry_run=true)
    APPROVE = "approve"  # wait for an operator's approval before applying


class Kind(StrEnum):
    """cgloop.v1.DetectionKind without its prefix, lower case."""

    SLO_LATENCY = "slo_latency"
    SLO_JITTER = "slo_jitter"
    SLO_LOSS = "slo_loss"
    SLO_THROUGHPUT = "slo_throughput"
    L4S_UNRESPONSIVE_ECN = "l4s_unresponsive_ecn"
    L4S_MICROBURST = "l4s_microburst"
    CLASSIC_QUEUE_BURST = "classic_queue_burst"
    GAMING_FLOW_CLASSIFIED = "gaming_flow_classified"
    NODE_OVERLOAD = "node_overload"
    FUNCTION_OVERLOAD = "function_overload"
    QUEUE_CONGESTION = "queue_congestion"
    PATH_CHANGE = "path_change"
    PACKET_DROPS = "packet_drops"
    TELEMETRY_GAP = "telemetry_gap"
    FLOW_ANOMALY = "flow_anomaly"


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    MINOR = "minor"
    MAJOR = "major"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return list(Severity).index(self) + 1  # same numbers as cgloop.v1.Severity


class Subject(StrEnum):
    ANY = "any"
    FLOW = "flow"
    QUEUE = "queue"
    NODE = "node"
    FUNCTION = "function"
    LINK = "link"


class Match(Strict):
    """Which detections a policy acts on; every given condition must hold."""

    kinds: list[Kind] = Field(min_length=1)
    severity_at_least: Severity = Severity.WARNING
    subject: Subject = Subject.ANY
    # Label equality; the value "*" only requires the label to be present.
    labels: dict[str, str] = Field(default_factory=dict)
    min_confidence: float = Field(default=0.0, ge=0, le=1)


class Trigger(Strict):
    """Hysteresis: act only after `consecutive` matching detections of the same subject, each
    within `within` of the previous; a detection of the same subject and kind that does not
    match (it has recovered below the severity) starts the count again."""

    consecutive: int = Field(default=1, ge=1)
    within: Duration = 10.0


class Comparator(StrEnum):
    LESS_THAN = "less_than"
    LESS_OR_EQUAL = "less_or_equal"
    GREATER_THAN = "greater_than"
    GREATER_OR_EQUAL = "greater_or_equal"


# The SLO table's objectives (cgloop.slo) an expectation can take its value from, in the unit
# of the metrics compared with them (`probe.*_rtt_ns` and `flow.rtp_jitter_ns` in ns, the loss
# ratios as fractions, `flow.throughput_bps` in bit/s).
SLO_VALUES: dict[str, Any] = {
    "slo.latency_ns": lambda o: o.latency_ns,
    "slo.jitter_ns": lambda o: round(o.jitter_ms * 1_000_000),
    "slo.loss": lambda o: o.loss,
    "slo.min_down_bps": lambda o: round(o.min_down_mbps * 1_000_000),
}
SloValue = StrEnum(  # type: ignore[misc]
    "SloValue", {name.split(".")[1].upper(): name for name in SLO_VALUES}
)
# The detection label naming a gaming flow's platform (the classifier's and the SLO detector's).
PLATFORM_LABEL = "platform"


class Expect(Strict):
    """What the action must achieve; verification reads the metric after `within`.

    The expected value is a number (`value`) or an objective of the SLO table (`value_from`):
    the objective of the platform the triggering detection's `platform` label names (a platform
    without a profile of its own, or no label: `generic`), under the deployment profile
    `slo_profile` if one is named."""

    metric: str = Field(pattern=r"^[a-z0-9_]+\.[a-z0-9_]+$")  # e.g. probe.p99_rtt_ns
    comparator: Comparator = Comparator.LESS_THAN
    value: float | None = None
    value_from: SloValue | None = None
    slo_profile: str | None = None
    within: Duration = 2.0
    # Window read before the action as the baseline, and the relative change that counts as
    # "worse" (after worse than before by more than this fraction).
    baseline_window: Duration = 2.0
    worse_tolerance: float = Field(default=0.1, ge=0)
    # Also held to these function counters over the same window (set_chain only): the verdict
    # is `improved` only when the metric and every counter hold.
    also: list[CounterMetric] = Field(default_factory=list)
    # probe.* metrics: only the probes sent with this DSCP (e.g. 46, the gaming class's), for
    # an action without a flow of its own (a chain, a queue); absent: every probe that measures
    # the action (cgloop.policy.telemetry.WindowStore).
    probe_dscp: int | None = Field(default=None, ge=0, le=63)

    @field_validator("slo_profile")
    @classmethod
    def _known_profile(cls, value: str | None) -> str | None:
        if value is not None and value not in slo.table().deployments:
            known = ", ".join(sorted(slo.table().deployments)) or "none"
            raise ValueError(f"no SLO deployment profile {value!r} (known: {known})")
        return value

    @model_validator(mode="after")
    def _one_value(self) -> Expect:
        if (self.value is None) == (self.value_from is None):
            raise ValueError(
                "give the expected value either as `value` (a number) or as `value_from` "
                f"(an SLO objective: {', '.join(SLO_VALUES)}), not "
                + ("both" if self.value is not None else "neither")
            )
        if self.slo_profile is not None and self.value_from is None:
            raise ValueError("slo_profile: only applies with `value_from`")
        return self

    def resolve(self, labels: Mapping[str, str]) -> float:
        """The expected value for a detection with these labels: `value`, or the SLO table's
        objective for the platform its `platform` label names (`generic` without one)."""
        if self.value_from is None:
            assert self.value is not None  # _one_value
            return self.value
        platform = labels.get(PLATFORM_LABEL, "").strip().lower() or slo.GENERIC
        objectives = slo.table().objectives(platform, self.slo_profile)
        return float(SLO_VALUES[self.value_from.value](objectives))


class CounterMetric(StrEnum):
    """Function counters an action is also held to (`expect.also`), read from the node samples
    of the action's node for the chain's advanced functions, with their bounds: the busiest
    instance's busy ratio under the overload guard's margin (R_max), and no ring overflow."""

    BUSY_RATIO = "function.busy_ratio"
    RX_DROPPED_PER_S = "function.rx_dropped_per_s"


class Verdict(StrEnum):
    WORSE = "worse"
    NO_EFFECT = "no_effect"


class Bound(Strict):
    min: float | None = None
    max: float | None = None


class Frequency(Strict):
    """ONAP's frequency limiter: at most `limit` actions per operation and target in `window`."""

    limit: int = Field(ge=1)
    window: Duration


class Blacklist(Strict):
    node_ids: list[str] = Field(default_factory=list)
    addresses: list[str] = Field(default_factory=list)  # textual IPs of flow endpoints
    device_ids: list[str] = Field(default_factory=list)


class Guards(Strict):
    hold_time: Duration = 5.0  # min time between two actions of this policy on one target
    cooldown: Duration = 0.0  # min time after any action on the target ended (verified/rolled back)
    frequency: Frequency | None = None
    bounds: dict[str, Bound] = Field(default_factory=dict)  # parameter -> min/max
    blacklist: Blacklist = Field(default_factory=Blacklist)
    # Coordination: while this policy's action is in flight or holding on a target, these
    # operations are refused on the same target (ONAP's "first blocks second").
    blocks: list[Operation] = Field(default_factory=list)


# Where the action applies; "{label:NAME}" takes a detection label, "{subject}" its subject.
TEMPLATE = r"^([^{}]|\{label:[A-Za-z0-9_.-]+\}|\{subject\})*$"


class Target(Strict):
    node_id: str | None = Field(default=None, pattern=TEMPLATE)
    interface_name: str | None = Field(default=None, pattern=TEMPLATE)
    device_id: str | None = Field(default=None, pattern=TEMPLATE)
    queue_id: int | None = Field(default=None, ge=0)


class PlanKind(StrEnum):
    SCALE_OUT = "scale_out"  # Natif: instances and cores of an overloaded function
    PLACE = "place"  # LB / LC / LBLC: which node of the session's path gets the chain
    XMAN = "xman"  # X-MAN: a node's cores, its latency-critical ones and their P-state range


class Heuristic(StrEnum):
    LB = "lb"
    LC = "lc"
    LBLC = "lblc"


class Plan(Strict):
    """A planner fills in what the YAML cannot know (cgloop.policy.planning), from the node
    samples: `scale_out` the instances and cores of `function`, `place` the node among
    `candidates` (the first is the session's own node) and the core of the advanced function
    (both set_chain); `xman` a set_power_policy's cores, latency-critical cores and frequency
    range (the policy's values stand without samples)."""

    planner: PlanKind
    function: str | None = Field(default=None, pattern=TEMPLATE)
    min_instances: int = Field(default=2, ge=1, le=64)
    heuristic: Heuristic = Heuristic.LBLC
    candidates: list[Annotated[str, Field(pattern=TEMPLATE, min_length=1)]] = Field(
        default_factory=list
    )

    @model_validator(mode="after")
    def _fits_planner(self) -> Plan:
        if self.planner is PlanKind.PLACE and not self.candidates:
            raise ValueError("planner place needs candidates (the session's node first)")
        if self.planner is PlanKind.SCALE_OUT and self.candidates:
            raise ValueError("candidates: only for planner place")
        return self


class ActionSpec(Strict):
    operation: Operation
    target: Target = Field(default_factory=Target)
    # The fields of the operation's protobuf message (cgloop.v1 Action.spec), checked against
    # its descriptor by `cgloop.policy.parameters` (names, types, accepted values).
    parameters: dict[str, Any] = Field(default_factory=dict, validate_default=True)
    deadline: Duration = 0.5  # EXPIRED when not applied this long after the detection
    expect: Expect | None = None
    rollback_on: list[Verdict] = Field(default_factory=lambda: [Verdict.WORSE])
    plan: Plan | None = None

    @model_validator(mode="after")
    def _plan_and_expect_fit_operation(self) -> ActionSpec:
        if self.plan is not None:
            wants = (
                Operation.SET_POWER_POLICY
                if self.plan.planner is PlanKind.XMAN
                else Operation.SET_CHAIN
            )
            if self.operation is not wants:
                raise ValueError(
                    f"plan: planner {self.plan.planner.value} fills in {wants.value}, not "
                    f"{self.operation.value}"
                )
        if self.expect is not None and self.expect.also and self.operation is not (
            Operation.SET_CHAIN
        ):
            raise ValueError("expect.also: function counters verify set_chain only")
        return self

    @field_validator("parameters")
    @classmethod
    def _parameters_fit_operation(cls, value: dict[str, Any], info: ValidationInfo) -> Any:
        op = info.data.get("operation")
        if op is None:
            return value  # the operation itself is wrong: reported on its own field
        try:
            parameters.parse(op.value, value)
        except parameters.ParameterError as exc:
            # Each problem at the parameter's own location (action.parameters.NAME...), so the
            # error names the line of the offending value.
            errors = [
                InitErrorDetails(
                    type=PydanticCustomError("parameter", "{problem}", {"problem": problem}),
                    loc=loc,
                    input=value,
                )
                for loc, problem in exc.problems
            ]
            raise ValidationError.from_exception_data(cls.__name__, errors) from None
        return value


def parameter_names(op: Operation) -> tuple[set[str], set[str]]:
    """(required, optional) parameter names of an operation."""
    return parameters.field_names(op.value)


class Policy(Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$", max_length=80)
    description: str = ""
    level: Level = Level.MICRO
    mode: Mode = Mode.ENFORCE
    enabled: bool = True
    # Lower first when several policies match the same detection; all matching policies act.
    priority: int = 100
    match: Match
    trigger: Trigger = Field(default_factory=Trigger)
    action: ActionSpec
    guards: Guards = Field(default_factory=Guards)

    @model_validator(mode="after")
    def _bounds_name_parameters(self) -> Policy:
        # A bound on a name the operation does not take would silently never apply; one the
        # policy's own value breaks would refuse every action of the policy.
        required, optional = parameter_names(self.action.operation)
        for name, bound in self.guards.bounds.items():
            if name not in required | optional:
                raise ValueError(
                    f"guards.bounds.{name}: operation {self.action.operation.value} has no "
                    f"parameter {name} (it takes {', '.join(sorted(required | optional))})"
                )
            value = self.action.parameters.get(name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if (bound.min is not None and value < bound.min) or (
                bound.max is not None and value > bound.max
            ):
                raise ValueError(
                    f"guards.bounds.{name}: the policy's own {name} {value:g} is outside "
                    f"{bound.min if bound.min is not None else '…'}.."
                    f"{bound.max if bound.max is not None else '…'}"
                )
        return self

    @model_validator(mode="after")
    def _level_fits_operation(self) -> Policy:
        onos = {
            Operation.ONOS_FLOW_RULE,
            Operation.ONOS_QUEUE,
            Operation.ONOS_METER,
            Operation.ONOS_INTENT,
            Operation.SET_CHAIN,
        }
        if self.action.operation in onos and self.level is not Level.GLOBAL:
            raise ValueError(
                f"operation {self.action.operation.value} is a global-loop action: "
                "set level: global"
            )
        return self


class PolicyFile(Strict):
    """A file with several policies; a file with just one may be the policy mapping itself."""

    policies: list[Policy] = Field(min_length=1)


def json_schema() -> dict[str, Any]:
    """The published JSON Schema of a policy file (either shape)."""
    schema = PolicyFile.model_json_schema()
    defs = schema.pop("$defs", {})
    defs["PolicyFile"] = schema
    # Each operation's parameters, from the descriptors of the messages the loader checks.
    conditions = []
    for op, descriptor in parameters.ORDERABLE.items():
        defs[descriptor.name] = parameters.json_schema(descriptor, defs)
        conditions.append(
            {
                "if": {"properties": {"operation": {"const": op}}, "required": ["operation"]},
                "then": {"properties": {"parameters": {"$ref": f"#/$defs/{descriptor.name}"}}},
            }
        )
    defs["ActionSpec"]["allOf"] = conditions
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://cgloop.dev/schemas/policy/v1.json",
        "title": "cgloop policy file",
        "anyOf": [{"$ref": "#/$defs/Policy"}, {"$ref": "#/$defs/PolicyFile"}],
        "$defs": defs,
    }


SCHEMA_PATH = Path(__file__).with_name("policy.schema.json")
DEFAULTS_DIR = Path(__file__).with_name("policies")


def write_schema(path: Path = SCHEMA_PATH) -> None:
    path.write_text(json.dumps(json_schema(), indent=2, sort_keys=True) + "\n")


class PolicyError(ValueError):
    """Invalid policy: every problem with its file, line and field."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


def _node_at(node: yaml.Node | None, loc: Iterable[Any]) -> yaml.Node | None:
    """The YAML node a pydantic error location points to (the deepest one that exists)."""
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            found = next((v for k, v in node.value if k.value == str(key)), None)
            if found is None:
                key_node = next((k for k, _ in node.value if k.value == str(key)), None)
                return key_node or node
            node = found
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int):
            if key >= len(node.value):
                return node
            node = node.value[key]
        else:
            return node
    return node


def _describe(loc: tuple[Any, ...]) -> str:
    # Pydantic adds the union member / enum tag to locations; keep only what a user wrote.
    parts = [str(p) for p in loc if not (isinstance(p, str) and "[" in p)]
    return ".".join(parts) or "(top level)"


def parse_policies(text: str, source: str = "<string>") -> list[Policy]:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise PolicyError([f"{source}{line}: not valid YAML: {exc}"]) from None
    if not isinstance(data, dict):
        raise PolicyError([f"{source}:1: a policy file is a mapping (a policy, or `policies:`)"])
    single = "policies" not in data
    try:
        return PolicyFile.model_validate({"policies": [data]} if single else data).policies
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            if single:
                loc = loc[2:]  # drop the ("policies", 0) we wrapped it in
            node = _node_at(root, loc)
            line = node.start_mark.line + 1 if node is not None else 1
            problems.append(f"{source}:{line}: {_describe(loc)}: {err['msg']}")
        raise PolicyError(problems) from None


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PolicyError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise PolicyError(
            [f"{path}:{line}: not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start})"]
        ) from None


def load_policies(paths: Iterable[Path]) -> list[Policy]:
    """Load files and directories (*.yaml, *.yml); ids must be unique across the set."""
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            files += sorted([*p.glob("*.yaml"), *p.glob("*.yml")])
        elif p.exists():
            files.append(p)
        else:
            raise PolicyError([f"{p}: no such file or directory"])
    problems: list[str] = []
    policies: list[Policy] = []
    seen: dict[str, str] = {}
    for f in files:
        try:
            loaded = parse_policies(_read_text(f), str(f))
        except PolicyError as exc:
            problems += exc.problems
            continue
        for pol in loaded:
            if pol.id in seen:
                problems.append(f"{f}: id: policy {pol.id!r} is already defined in {seen[pol.id]}")
            seen[pol.id] = str(f)
            policies.append(pol)
    if problems:
        raise PolicyError(problems)
    return sorted(policies, key=lambda p: (p.priority, p.id))


def default_policies() -> list[Policy]:
    return load_policies([DEFAULTS_DIR])
