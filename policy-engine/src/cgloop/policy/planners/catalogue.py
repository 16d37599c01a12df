"""The chain-function catalogue, read from the generated descriptors of node_agent.proto.

Every function the node agent can run is a member of `cgloop.v1.ChainFunction.function`; its
message's fields are its parameters, each with its accepted values (`param_rule` option), and
the message carries its CALVIN kind and its Natif bound (`function_traits` option). The agent
checks requests with a table generated from the same declaration (cgloop_proto::catalogue);
this module is the Python reading of it, used by the planners, the policy validator and the
fake agent (`cgloop.policy.testing`). `check` follows the agent's order and wording, so a
chain is refused by both, with the same message (tests/test_node_agent_netns.py compares them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cgloop.v1 import node_agent_pb2 as na
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

ELEMENTARY = na.FUNCTION_KIND_ELEMENTARY
BASIC = na.FUNCTION_KIND_BASIC
ADVANCED = na.FUNCTION_KIND_ADVANCED
IO_BOUND = na.FUNCTION_BOUND_IO
CPU_BOUND = na.FUNCTION_BOUND_CPU


class CatalogueError(ValueError):
    """A chain function the agent refuses: not in the catalogue, parameters outside their
    declared values, or declared in the wrong place (CALVIN)."""


@dataclass(frozen=True)
class Param:
    """One parameter (a field of a function's message) and its ParamRule."""

    name: str
    number: int
    type: str  # "uint", "str", "bool" or "message"
    optional: bool  # `optional` or in a oneof: may be absent
    oneof: str | None  # the real oneof it belongs to
    min: int | None
    max: int | None
    interface: bool
    rate: bool

    def accepted(self) -> str:
        """The accepted values, worded as the agent words them ("0..63", "length 1..15")."""
        if self.min is not None and self.max is not None:
            text = f"{self.min}..{self.max}"
        elif self.min is not None:
            text = f"{self.min}.."
        elif self.max is not None:
            text = f"0..{self.max}"
        else:
            text = "any"
        return f"length {text}" if self.type == "str" else text


@dataclass(frozen=True)
class Function:
    """One function of the catalogue."""

    name: str  # the oneof member's name, e.g. "rate_limit"
    number: int
    message: Descriptor
    kind: int  # na.FunctionKind
    bound: int  # na.FunctionBound
    needs_a_parameter: bool
    oneofs: tuple[str, ...]
    params: tuple[Param, ...]

    @property
    def kind_name(self) -> str:
        return na.FunctionKind.Name(self.kind)

    @property
    def in_bpf(self) -> bool:
        return self.kind != ADVANCED


_TYPES = {
    FieldDescriptor.TYPE_UINT32: "uint",
    FieldDescriptor.TYPE_UINT64: "uint",
    FieldDescriptor.TYPE_STRING: "str",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_MESSAGE: "message",
}


def _param(field: FieldDescriptor) -> Param:
    opts = field.GetOptions()
    rule = opts.Extensions[na.param_rule] if opts.HasExtension(na.param_rule) else na.ParamRule()
    oneof = field.containing_oneof
    real_oneof = oneof is not None and not oneof.name.startswith("_")  # `optional`: synthetic
    return Param(
        name=field.name,
        number=field.number,
        type=_TYPES[field.type],
        optional=oneof is not None,
        oneof=oneof.name if real_oneof else None,
        min=rule.min if rule.HasField("min") else None,
        max=rule.max if rule.HasField("max") else None,
        interface=rule.interface,
        rate=rule.rate,
    )


def _load() -> dict[str, Function]:
    out: dict[str, Function] = {}
    for member in na.ChainFunction.DESCRIPTOR.oneofs_by_name["function"].fields:
        msg = member.message_type
        traits = msg.GetOptions().Extensions[na.function_traits]
        params = tuple(_param(f) for f in msg.fields)
        oneofs = tuple(dict.fromkeys(p.oneof for p in params if p.oneof))
        out[member.name] = Function(
            member.name,
            member.number,
            msg,
            traits.kind,
            traits.bound,
            traits.needs_a_parameter,
            oneofs,
            params,
        )
    return out


FUNCTIONS: dict[str, Function] = _load()


def table() -> list[dict[str, Any]]:
    """The catalogue as plain data, in the shape `cgloop-vectors chain-catalogue` prints (the
    agent's reading of the same declaration)."""
    return [
        {
            "name": f.name,
            "number": f.number,
            "message": f.message.name,
            "kind": f.kind_name,
            "bound": na.FunctionBound.Name(f.bound),
            "needs_a_parameter": f.needs_a_parameter,
            "oneofs": list(f.oneofs),
            "params": [
                {
                    "name": p.name,
                    "number": p.number,
                    "type": p.type,
                    "optional": p.optional,
                    "oneof": p.oneof,
                    "min": p.min,
                    "max": p.max,
                    "interface": p.interface,
                    "rate": p.rate,
                }
                for p in f.params
            ],
        }
        for f in FUNCTIONS.values()
    ]


def known() -> str:
    """Every function with where it runs, worded as the agent's refusals list them."""
    return ", ".join(
        f"{f.name} ({f.kind_name.removeprefix('FUNCTION_KIND_').lower()})"
        for f in FUNCTIONS.values()
    )


def name_of(fn: na.ChainFunction) -> str:
    """The function's name (its member of `function`), "" when none is set."""
    return fn.WhichOneof("function") or ""


def spec_of(fn: na.ChainFunction) -> Function | None:
    return FUNCTIONS.get(name_of(fn))


def values(fn: na.ChainFunction) -> list[tuple[Param, Any]]:
    """The parameters a request gives: present fields, and plain fields at their default (the
    agent reads the same from the encoded message). Strings are measured in UTF-8 bytes."""
    spec = spec_of(fn)
    if spec is None:
        return []
    msg = getattr(fn, spec.name)
    out: list[tuple[Param, Any]] = []
    for p in spec.params:
        if p.optional and not msg.HasField(p.name):
            continue
        value = getattr(msg, p.name)
        out.append((p, True if p.type == "message" else value))
    return out


def _value_text(p: Param, value: Any) -> str:
    return json.dumps(value, ensure_ascii=False) if p.type == "str" else str(value)


def violation(fn: na.ChainFunction) -> str | None:
    """The first parameter outside its declared values (the agent's order and wording)."""
    spec = spec_of(fn)
    if spec is None:
        return None
    given = values(fn)
    for p, value in given:
        if p.type not in ("uint", "str"):
            continue
        n = len(value.encode()) if p.type == "str" else int(value)
        if (p.min is not None and n < p.min) or (p.max is not None and n > p.max):
            return f"{p.name} {_value_text(p, value)} is not within {p.accepted()}"
    for oneof in spec.oneofs:
        if not any(p.oneof == oneof for p, _ in given):
            members = [p.name for p in spec.params if p.oneof == oneof]
            return f"{oneof}: set one of {', '.join(members)}"
    if spec.needs_a_parameter and not given:
        return f"set {', '.join(p.name for p in spec.params)}, or several"
    return None


def check(fn: na.ChainFunction, pos: int = 0) -> Function:
    """What the agent checks of one chain function before its bounds (chains.rs `validate`):
    a function set, parameters within their declared values, the declared kind its CALVIN
    kind (unset: the catalogue's). Returns its catalogue entry; raises CatalogueError."""
    spec = spec_of(fn)
    if spec is None:
        raise CatalogueError(f"chain function #{pos}: no function set; known functions: {known()}")
    bad = violation(fn)
    if bad is not None:
        raise CatalogueError(f'chain function #{pos} "{spec.name}": {bad}')
    if fn.kind not in na.FunctionKind.values():
        raise CatalogueError(
            f'chain function #{pos} "{spec.name}": kind {fn.kind} is not a FunctionKind '
            f"(declare {spec.kind_name} or leave it unset)"
        )
    asked = fn.kind or spec.kind
    if asked != spec.kind:
        why = (
            "touches the payload and is refused in BPF; it runs in user space"
            if spec.kind == ADVANCED
            else "is header-only and runs in BPF; a function is never moved to (or split into) "
            "user space"
        )
        raise CatalogueError(
            f'CALVIN: chain function #{pos} "{spec.name}" {why}: declare it {spec.kind_name} '
            f"(or leave kind unset), not {na.FunctionKind.Name(asked)}"
        )
    return spec


def _payload_rules(fn: na.ChainFunction, pos: int) -> None:
    """What the agent's user-space functions check beyond the declared values (payload.rs)."""
    if name_of(fn) == "dpi" and fn.dpi.WhichOneof("pattern") == "hex":
        digits = fn.dpi.hex.strip()
        if len(digits) % 2 or any(c not in "0123456789abcdefABCDEF" for c in digits):
            raise CatalogueError(
                f'chain function #{pos} "dpi": hex {json.dumps(fn.dpi.hex)} is not hex bytes '
                "(two digits each)"
            )


def check_instances(fn: na.ChainFunction, pos: int, max_instances: int | None = None) -> None:
    """Natif's scale-out of one function as the agent checks it (bounds.rs `instances`):
    `instances` > 1 only for an advanced function and at most `max_instances` (the agent's
    `[bounds] max_function_instances`; None: not checked), `instance_cores` empty or one core
    per instance. The cores themselves are the bounds' to check. Raises CatalogueError."""
    spec = spec_of(fn)
    if spec is None:
        return
    at = f'chain function #{pos} "{spec.name}"'
    if fn.instances > 1 and spec.kind != ADVANCED:
        raise CatalogueError(
            f"{at}: instances {fn.instances} is not within 0..1: only advanced functions scale "
            "out (a basic function runs in BPF on every core that receives the packet)"
        )
    if max_instances is not None and fn.instances > max_instances:
        raise CatalogueError(
            f"{at}: instances {fn.instances} is not within 0..{max_instances} (the agent's "
            "[bounds] max_function_instances)"
        )
    n = max(fn.instances, 1)
    if fn.instance_cores and len(fn.instance_cores) != n:
        raise CatalogueError(
            f"{at}: instance_cores has {len(fn.instance_cores)} entries; give one core per "
            f"instance ({n}) or none"
        )


def check_chain(chain: na.ServiceChain) -> list[Function]:
    """What the agent checks of a chain after its bounds (chains.rs `compile`): every function
    (`check`), then in packet order CALVIN's rule (basic functions run in BPF before the
    hand-over to user space, so none follows an advanced one) and each user-space function's
    own rules, and each function's scale-out (`check_instances`, without the agent's bound).
    Returns the catalogue entries; raises CatalogueError."""
    for pos, fn in enumerate(chain.functions):
        check_instances(fn, pos)
    specs = [check(fn, pos) for pos, fn in enumerate(chain.functions)]
    seen_advanced = False
    for pos, (fn, spec) in enumerate(zip(chain.functions, specs, strict=True)):
        if spec.kind == ADVANCED:
            seen_advanced = True
            _payload_rules(fn, pos)
        elif seen_advanced:
            raise CatalogueError(
                f'CALVIN: chain function #{pos} "{spec.name}" is basic but follows an advanced '
                "one; basic functions run in BPF before the hand-over to user space, so put "
                "them first"
            )
    return specs


def function(spec: Mapping[str, Any] | str) -> na.ChainFunction:
    """A ChainFunction from its policy form: a function name alone ("forward"), or a mapping
    with one key, the function's name, whose value holds its parameters
    ({"mark": {"dscp": 46}}; proto JSON names: {"dpi": {"text": "GAME", "mark_dscp": 46}}).
    Unknown functions or parameters and wrong types raise CatalogueError; the declared values
    are checked by `check`."""
    if isinstance(spec, str):
        spec = {spec: {}}
    if not isinstance(spec, Mapping) or len(spec) != 1:
        raise CatalogueError(f"a chain function is one function name with its parameters: {spec!r}")
    ((name, params),) = spec.items()
    if name not in FUNCTIONS:
        raise CatalogueError(f"function {name!r} is not in the catalogue; known: {known()}")
    try:
        return json_format.ParseDict({name: params or {}}, na.ChainFunction())
    except json_format.ParseError as e:
        accepted = ", ".join(p.name for p in FUNCTIONS[name].params) or "no parameters"
        raise CatalogueError(f"function {name!r}: {e} (takes {accepted})") from e


def to_spec(fn: na.ChainFunction) -> dict[str, Any]:
    """The policy form of a function (inverse of `function`)."""
    name = name_of(fn)
    return {name: json_format.MessageToDict(getattr(fn, name), preserving_proto_field_name=True)}
