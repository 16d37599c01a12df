"""Validation of request bodies against ONOS's published REST definitions (vendored in
`schemas/`), with the two documented corrections of their defects (schemas/README.md)."""

from __future__ import annotations

import copy
import json
from functools import cache
from importlib import resources
from typing import Any

import jsonschema
from cgloop.actuators.onos.errors import OnosValidationError
from jsonschema import Draft4Validator

# The definitions are swagger 2.0 schema objects, a JSON Schema draft 4 dialect.
SCHEMAS = ("FlowsPost", "FlowsBatchPost", "IntentPoint", "MeterPost")


def _int64(checker: Any, instance: Any) -> bool:
    # Defect 1: "type": "int64" on ethType; ONOS's codec takes a number or "0x0800".
    return checker.is_type(instance, "integer") or checker.is_type(instance, "string")


_Validator = jsonschema.validators.extend(
    Draft4Validator,
    type_checker=Draft4Validator.TYPE_CHECKER.redefine("int64", _int64),
)


def raw_schema(name: str) -> dict[str, Any]:
    """A vendored definition exactly as ONOS publishes it."""
    if name not in SCHEMAS:
        raise KeyError(f"no vendored ONOS definition {name!r}; have {SCHEMAS}")
    text = resources.files("cgloop.actuators.onos").joinpath(f"schemas/{name}.json").read_text()
    return json.loads(text)


def _drop_instruction_port(flow: dict[str, Any]) -> None:
    # Defect 2: instructions declared to require "port"; only OUTPUT needs it
    # (DecodeInstructionCodecHelper.decode: QUEUE reads it optionally, METER/GROUP never).
    items = flow.get("properties", {}).get("treatment", {}).get("properties", {})
    items = items.get("instructions", {}).get("items", {})
    if "port" in items.get("required", []):
        items["required"] = [r for r in items["required"] if r != "port"]


@cache
def schema(name: str) -> dict[str, Any]:
    """The definition with the documented corrections applied."""
    s = copy.deepcopy(raw_schema(name))
    if name == "FlowsPost":
        _drop_instruction_port(s)
    elif name == "FlowsBatchPost":
        _drop_instruction_port(s["properties"]["flows"]["items"])
    return s


@cache
def _validator(name: str) -> Any:
    return _Validator(schema(name))


@cache
def _part_validator(part: str) -> Any:
    # Intents carry the same selector/treatment codecs as flows, but IntentPoint.json does not
    # describe them: check them against the flow definition's parts.
    return _Validator(schema("FlowsPost")["properties"][part])


def _raise(what: str, errors: list[Any]) -> None:
    if errors:
        detail = "; ".join(
            f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}" for e in errors
        )
        raise OnosValidationError(f"{what} breaks ONOS's REST definition: {detail}")


def validate(name: str, body: Any) -> None:
    """Raise OnosValidationError naming every violation of definition `name`."""
    errors = sorted(_validator(name).iter_errors(body), key=lambda e: list(e.absolute_path))
    _raise(name, errors)


def validate_intent(body: dict[str, Any]) -> None:
    validate("IntentPoint", body)
    for part in ("selector", "treatment"):
        if part in body:
            _raise(f"IntentPoint.{part}", list(_part_validator(part).iter_errors(body[part])))
