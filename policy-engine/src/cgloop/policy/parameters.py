"""Action parameters: the operation's protobuf message (cgloop.v1 Action.spec), read from YAML.

A policy's `action.parameters` are the fields of the operation's message (the `spec` member
named like the operation: reprioritise_flow -> ReprioritiseFlowAction ...). Everything here is
read from the descriptors, nothing is listed twice: which fields exist, their types and
widths, their accepted values (the `param_rule` field option of node_agent.proto, also on the
action messages), the enum names (`xman_mode: load` is XMAN_MODE_LOAD) and the oneofs (one
member at most). A value is checked strictly, as YAML gave it: "46" is not a DSCP, true is not
a class id, 5.0 is not a rate. json_format then builds the message. The few rules across
fields or beyond a range (a class handle needs a minor, ceil >= rate, min <= max frequency)
are `_RULES` below, written against the typed message.

String values may hold the engine's templates (`{subject}`, `{label:NAME}`); they are checked
as strings here and resolved when an action is decided (`build`).

Old records: actions decided before `spec` existed carry `parameters` (map<string,string>);
`spec_of` reads them into the typed message with the same descriptors (`legacy_spec`), and
`previous_of` reads an old `previous_parameters` map into a PreviousState.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from cgloop.policy.planners import catalogue
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import node_agent_pb2 as na
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

Loc = tuple[str | int, ...]
Problem = tuple[Loc, str]

SPEC = apb.Action.DESCRIPTOR.oneofs_by_name["spec"]
# Operation name -> its message descriptor (the oneof member of the same name).
MESSAGES: dict[str, Descriptor] = {
    f.name: f.message_type for f in SPEC.fields if f.name != "rollback"
}
# Operations only a node agent records (action.proto: "Node level only"): what its micro loop did
# on its own. The engine reads them as facts; a policy cannot order them.
NODE_ONLY = frozenset({"queue_protection_sanction", "set_core_frequency"})
# What a policy can order.
ORDERABLE: dict[str, Descriptor] = {k: v for k, v in MESSAGES.items() if k not in NODE_ONLY}

_INT_RANGE = {
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
}
_FLOATS = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)
_TEMPLATE = re.compile(r"\{subject\}|\{label:[A-Za-z0-9_.-]+\}")


class ParameterError(ValueError):
    """Parameters that do not fit the operation's message: every problem with its location."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__(
            "; ".join(f"{'.'.join(map(str, loc)) or '(top)'}: {m}" for loc, m in problems)
        )


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _real_oneof(field: FieldDescriptor) -> str | None:
    o = field.containing_oneof
    if o is None or (len(o.fields) == 1 and o.name == f"_{field.name}"):
        return None
    return o.name


def rule(field: FieldDescriptor) -> na.ParamRule | None:
    """The field's `param_rule` option (accepted values), if it declares one."""
    options = field.GetOptions()
    return options.Extensions[na.param_rule] if options.HasExtension(na.param_rule) else None


def required(field: FieldDescriptor) -> bool:
    """A plain (not optional, not oneof) scalar whose rule excludes its default (min >= 1)."""
    r = rule(field)
    return (
        r is not None
        and r.HasField("min")
        and r.min >= 1
        and not field.has_presence
        and not field.is_repeated
    )


def enum_prefix(enum: EnumDescriptor) -> str:
    """XmanMode's values are XMAN_MODE_*: the prefix a short name (`load`) goes without."""
    return enum.values[0].name.removesuffix("UNSPECIFIED")


def enum_names(enum: EnumDescriptor) -> list[str]:
    prefix = enum_prefix(enum)
    return [v.name.removeprefix(prefix).lower() for v in enum.values if v.number != 0]


def _check_scalar(field: FieldDescriptor, value: Any, loc: Loc) -> list[Problem]:
    t = field.type
    if field.enum_type is not None:
        names = enum_names(field.enum_type)
        if not isinstance(value, str) or (
            value.lower() not in names and value not in field.enum_type.values_by_name
        ):
            return [(loc, f"should be one of {', '.join(names)}")]
        return []
    if t == FieldDescriptor.TYPE_BOOL:
        return [] if isinstance(value, bool) else [(loc, "should be true or false")]
    if t in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
        if not isinstance(value, str):
            return [(loc, "should be a string")]
        r = rule(field)
        n = len(value)
        short = r is not None and r.HasField("min") and n < r.min
        long = r is not None and r.HasField("max") and n > r.max
        if (short or long) and not _TEMPLATE.search(value):
            assert r is not None
            lo = r.min if r.HasField("min") else 0
            hi = r.max if r.HasField("max") else "…"
            return [(loc, f"should be {lo}..{hi} characters long")]
        return []
    if t in _FLOATS:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return [(loc, "should be a number")]
        return []
    if isinstance(value, bool) or not isinstance(value, int):
        return [(loc, "should be an integer")]
    lo, hi = _INT_RANGE[t]
    r = rule(field)
    if r is not None:
        lo = max(lo, r.min) if r.HasField("min") else lo
        hi = min(hi, r.max) if r.HasField("max") else hi
    if not lo <= value <= hi:
        return [(loc, f"should be within {lo}..{hi}")]
    return []


def check(descriptor: Descriptor, data: Any, loc: Loc = (), what: str = "") -> list[Problem]:
    """Problems of `data` (YAML values) as `descriptor`'s message: unknown fields, wrong types,
    values outside a field's accepted range, several members of one oneof."""
    if not isinstance(data, Mapping):
        return [(loc, f"should be a mapping of {descriptor.name}'s fields")]
    problems: list[Problem] = []
    fields = descriptor.fields_by_name
    taken: dict[str, str] = {}
    for key, value in data.items():
        field = fields.get(key) if isinstance(key, str) else None
        at = (*loc, key)
        if field is None:
            names = ", ".join(fields) or "none"
            problems.append(
                (at, f"{what or descriptor.name} does not take this parameter (it takes {names})")
            )
            continue
        oneof = _real_oneof(field)
        if oneof is not None:
            if oneof in taken:
                problems.append((at, f"set only one of {oneof}'s members ({taken[oneof]} is set)"))
                continue
            taken[oneof] = key
        if _is_map(field):
            if not isinstance(value, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                problems.append((at, "should be a mapping of strings to strings"))
        elif field.is_repeated:
            if not isinstance(value, list):
                problems.append((at, "should be a list"))
                continue
            for i, item in enumerate(value):
                problems += _check_one(field, item, (*at, i))
        else:
            problems += _check_one(field, value, at)
    for name, field in fields.items():
        if required(field) and name not in data:
            problems.append(((*loc, name), f"{what or descriptor.name} needs this parameter"))
    return problems


def _shorthand(descriptor: Descriptor, value: Any) -> Any:
    """A message given as a name alone is the member of that name of its oneof, without
    parameters: `forward` is {forward: {}} in a chain's functions."""
    if isinstance(value, str) and descriptor.oneofs and value in descriptor.fields_by_name:
        return {value: {}}
    return value


def _check_one(field: FieldDescriptor, value: Any, loc: Loc) -> list[Problem]:
    m = field.message_type
    if m is not None and m.oneofs and isinstance(value, str) and value not in m.fields_by_name:
        members = ", ".join(f.name for o in m.oneofs for f in o.fields)
        return [(loc, f"{value!r} is not a {m.name} (one of {members})")]
    if field.message_type is not None:
        return check(field.message_type, _shorthand(field.message_type, value), loc)
    return _check_scalar(field, value, loc)


def _json_ready(descriptor: Descriptor, data: Mapping[str, Any]) -> dict[str, Any]:
    """YAML values as json_format takes them: enum short names spelled out in full."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        field = descriptor.fields_by_name[key]

        def one(v: Any, f: FieldDescriptor = field) -> Any:
            if f.message_type is not None and not _is_map(f):
                return _json_ready(f.message_type, _shorthand(f.message_type, v))
            if f.enum_type is not None and v not in f.enum_type.values_by_name:
                return enum_prefix(f.enum_type) + v.upper()
            return v

        out[key] = (
            [one(v) for v in value] if field.is_repeated and not _is_map(field) else one(value)
        )
    return out


def _leaf_handle(field: str, value: int) -> list[Problem]:
    # tc handles are MAJOR:MINOR in 16 bits each; the agent needs both (1:10 = 0x00010010).
    if value >> 16 == 0 or value & 0xFFFF == 0:
        return [
            (
                (field,),
                f"class_id {value:#010x} needs a major and a non-zero minor, e.g. "
                "1:10 = 0x00010010",
            )
        ]
    return []


def _reprioritise(m: apb.ReprioritiseFlowAction) -> list[Problem]:
    return _leaf_handle("class_id", m.class_id)


def _protect(m: apb.ProtectFlowAction) -> list[Problem]:
    return _leaf_handle("class_id", m.class_id)


def _class_rate(m: apb.SetClassRateAction) -> list[Problem]:
    out = _leaf_handle("class_id", m.class_id)
    if m.HasField("ceil_bps") and m.ceil_bps < m.rate_bps:
        out.append(((), f"ceil_bps {m.ceil_bps} is below rate_bps {m.rate_bps}"))
    return out


def _power(m: apb.SetPowerPolicyAction) -> list[Problem]:
    out: list[Problem] = []
    if m.min_frequency_khz > m.max_frequency_khz:
        out.append(
            (
                (),
                f"min_frequency_khz {m.min_frequency_khz} is above max_frequency_khz "
                f"{m.max_frequency_khz}",
            )
        )
    stray = sorted(set(m.latency_critical) - set(m.cores))
    if stray:
        out.append((("latency_critical",), f"cores {stray} are not among cores"))
    return out


def _chain(m: apb.SetChainAction) -> list[Problem]:
    # What the agent checks of each function (the catalogue's reading of the same options).
    out: list[Problem] = []
    if not m.functions:
        out.append((("functions",), "operation set_chain needs at least one function"))
    if m.processing_us and len(m.processing_us) != len(m.functions):
        out.append((("processing_us",), f"has {len(m.processing_us)} entries for "
                                         f"{len(m.functions)} functions"))
    for i, fn in enumerate(m.functions):
        try:
            catalogue.check(fn, i)
        except catalogue.CatalogueError as exc:
            out.append((("functions", i), str(exc)))
    return out


def _meter(m: apb.OnosMeterAction) -> list[Problem]:
    out: list[Problem] = []
    if not m.unit:
        out.append((("unit",), "operation onos_meter needs this parameter"))
    if not m.bands:
        out.append((("bands",), "operation onos_meter needs at least one band"))
    for i, band in enumerate(m.bands):
        if not band.type:
            out.append((("bands", i, "type"), "needs a band type"))
        if band.burst_size and not m.burst:
            out.append((("bands", i, "burst_size"), "is only applied with burst: true"))
    return out


def _intent(m: apb.OnosIntentAction) -> list[Problem]:
    out: list[Problem] = [
        ((name,), "operation onos_intent needs this parameter")
        for name in ("ingress", "egress")
        if not m.HasField(name)
    ]
    if m.HasField("ingress") and m.ingress == m.egress:
        out.append((("egress",), "is the ingress point"))
    return out


# Rules across fields or beyond a range, per operation (after the descriptor checks).
_RULES: dict[str, Callable[[Any], list[Problem]]] = {
    "reprioritise_flow": _reprioritise,
    "protect_flow": _protect,
    "set_class_rate": _class_rate,
    "set_power_policy": _power,
    "set_chain": _chain,
    "onos_meter": _meter,
    "onos_intent": _intent,
}


def parse(operation: str, data: Mapping[str, Any]) -> Message:
    """The operation's message from YAML values; ParameterError names every problem."""
    descriptor = MESSAGES[operation]
    problems = check(descriptor, data, what=f"operation {operation}")
    if problems:
        raise ParameterError(problems)
    message = getattr(apb, descriptor.name)()
    try:
        json_format.ParseDict(_json_ready(descriptor, data), message)
    except json_format.ParseError as exc:  # what the descriptor walk let through
        raise ParameterError([((), str(exc))]) from None
    problems = _RULES.get(operation, lambda _: [])(message)
    if problems:
        raise ParameterError(problems)
    return message


def resolve(data: Any, resolve_text: Callable[[str], str]) -> Any:
    """`data` with `resolve_text` applied to every string (the engine's templates)."""
    if isinstance(data, str):
        return resolve_text(data)
    if isinstance(data, list):
        return [resolve(v, resolve_text) for v in data]
    if isinstance(data, Mapping):
        return {k: resolve(v, resolve_text) for k, v in data.items()}
    return data


def field_names(operation: str) -> tuple[set[str], set[str]]:
    """(required, optional) top-level parameter names of an operation."""
    fields = MESSAGES[operation].fields
    req = {f.name for f in fields if required(f)}
    return req, {f.name for f in fields} - req


def numbers(message: Message) -> dict[str, float]:
    """The message's set top-level numeric fields (what guards' bounds compare)."""
    out = {}
    for field, value in message.ListFields():
        if field.is_repeated or field.message_type is not None or field.enum_type is not None:
            continue
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[field.name] = float(value)
    return out


# --- old records ---------------------------------------------------------------------------


def _legacy_value(field: FieldDescriptor, text: str) -> Any:
    if field.enum_type is not None:
        return text
    if field.type == FieldDescriptor.TYPE_BOOL:
        return text == "true"
    if field.type in _FLOATS:
        return float(text)
    if field.type in _INT_RANGE:
        return int(text, 0)
    return text


def legacy_spec(operation: str, params: Mapping[str, str]) -> Message:
    """An old action's `parameters` map as its operation's message (values were text; lists
    comma-separated)."""
    descriptor = MESSAGES[operation]
    data: dict[str, Any] = {}
    try:
        for key, text in params.items():
            field = descriptor.fields_by_name.get(key)
            if field is None or (field.message_type is not None and not _is_map(field)):
                raise ValueError(f"parameter {key}={text!r} has no typed form in {descriptor.name}")
            if field.is_repeated:
                data[key] = [_legacy_value(field, t.strip()) for t in text.split(",") if t.strip()]
            else:
                data[key] = _legacy_value(field, text)
    except ValueError as exc:
        raise ParameterError([((), f"old {operation} action: {exc}")]) from None
    return parse(operation, data)


def spec_of(action: apb.Action) -> Message:
    """The action's typed parameters: its `spec`, or an old action's `parameters` read into
    the same message. A rollback's spec is its PreviousState."""
    which = action.WhichOneof("spec")
    if which is not None:
        return getattr(action, which)
    name = apb.ActionOperation.Name(action.operation).removeprefix("ACTION_OPERATION_").lower()
    if name not in MESSAGES:
        raise ParameterError([((), f"action {action.id} has no operation")])
    return legacy_spec(name, action.parameters)  # type: ignore[arg-type]


_XMAN_TEXT = {n: i for i, n in enumerate(["unspecified", *enum_names(na.XmanMode.DESCRIPTOR)])}


def _legacy_power(text: str) -> na.PowerPolicy:
    # The text form old engines wrote: cores=2,3;governor=..;min=..;max=..;mode=..;cstates=..
    f = dict(kv.split("=", 1) for kv in text.split(";"))
    return na.PowerPolicy(
        cores=[int(c, 0) for c in f["cores"].split(",") if c],
        governor=f["governor"],
        min_frequency_khz=int(f["min"]),
        max_frequency_khz=int(f["max"]),
        xman_mode=_XMAN_TEXT.get(f["mode"], na.XMAN_MODE_OFF),
        forbid_cstates=f.get("cstates", "allow") == "forbid",
    )


def previous_of(result: apb.ActionResult, operation: int) -> apb.PreviousState:
    """What a rollback restores: the result's typed `previous`, or an old result's
    `previous_parameters` read into a PreviousState. ParameterError when an old record cannot
    be read (the text form of chains lost their functions' parameters)."""
    if result.HasField("previous"):
        return result.previous
    p = dict(result.previous_parameters)
    OP = apb.ActionOperation
    try:
        if operation == OP.ACTION_OPERATION_REPRIORITISE_FLOW:
            prev = apb.PreviousFlowClass()
            if p.get("absent") != "true":
                prev.class_id = int(p["class_id"], 0)
                if "rewrite_dscp" in p:
                    prev.rewrite_dscp = int(p["rewrite_dscp"], 0)
            return apb.PreviousState(flow_class=prev)
        if operation == OP.ACTION_OPERATION_SET_CLASS_RATE:
            return apb.PreviousState(
                class_rate=apb.PreviousClassRate(
                    class_id=int(p["class_id"], 0),
                    rate_bps=int(p["rate_bps"], 0),
                    ceil_bps=int(p["ceil_bps"], 0),
                )
            )
        if operation == OP.ACTION_OPERATION_SET_CHAIN:
            if p.get("functions"):
                raise ValueError(
                    f"the chain before ({p['functions']}) was recorded as text without its "
                    "functions' parameters; restore it by hand"
                )
            return apb.PreviousState(
                chain=apb.PreviousChain(chain_id=p["chain_id"], traffic_class=p["traffic_class"])
            )
        if operation == OP.ACTION_OPERATION_SET_POWER_POLICY:
            policies = [_legacy_power(v) for _, v in sorted(p.items())]
            return apb.PreviousState(power_policies=apb.PreviousPowerPolicies(policies=policies))
        if operation == OP.ACTION_OPERATION_ONOS_FLOW_RULE:
            return apb.PreviousState(
                onos_flow_rule=apb.InstalledFlowRule(device_id=p["device_id"], flow_id=p["flow_id"])
            )
    except (KeyError, ValueError) as exc:
        raise ParameterError([((), f"old rollback state {p}: {exc}")]) from None
    return apb.PreviousState()


# --- JSON Schema (the published policy schema's parameters) ------------------------------------


def _scalar_schema(field: FieldDescriptor) -> dict[str, Any]:
    if field.enum_type is not None:
        return {"enum": enum_names(field.enum_type)}
    if field.type == FieldDescriptor.TYPE_BOOL:
        return {"type": "boolean"}
    r = rule(field)
    if field.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
        out: dict[str, Any] = {"type": "string"}
        if r is not None and r.HasField("min"):
            out["minLength"] = r.min
        if r is not None and r.HasField("max"):
            out["maxLength"] = r.max
        return out
    if field.type in _FLOATS:
        return {"type": "number"}
    lo, hi = _INT_RANGE[field.type]
    if r is not None:
        lo = max(lo, r.min) if r.HasField("min") else lo
        hi = min(hi, r.max) if r.HasField("max") else hi
    return {"type": "integer", "minimum": lo, "maximum": hi}


def json_schema(descriptor: Descriptor, defs: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema of `descriptor`'s message as YAML parameters; nested messages go to `defs`
    (by message name) and are referenced."""
    properties: dict[str, Any] = {}
    for field in descriptor.fields:
        if _is_map(field):
            item: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"}}
        elif field.message_type is not None:
            name = field.message_type.name
            if name not in defs:
                defs[name] = {}  # placeholder: recursion stops here
                defs[name] = json_schema(field.message_type, defs)
            item = {"$ref": f"#/$defs/{name}"}
            if field.message_type.oneofs:  # a member's name alone (`forward`) is a shorthand
                names = [f.name for o in field.message_type.oneofs for f in o.fields]
                item = {"anyOf": [item, {"enum": names}]}
        else:
            item = _scalar_schema(field)
        if field.is_repeated and not _is_map(field):
            item = {"type": "array", "items": item}
        properties[field.name] = item
    out: dict[str, Any] = {
        "type": "object",
        "title": descriptor.name,
        "additionalProperties": False,
        "properties": properties,
    }
    req = sorted(f.name for f in descriptor.fields if required(f))
    if req:
        out["required"] = req
    return out
