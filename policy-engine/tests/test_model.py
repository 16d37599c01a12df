"""Policy files: validation errors name file, line and field; the JSON Schema is published."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from cgloop.policy import model

GOOD = """\
id: ok
match:
  kinds: [slo_latency]
action:
  operation: notify
"""


def errors(text: str) -> list[str]:
    with pytest.raises(model.PolicyError) as exc:
        model.parse_policies(text, "p.yaml")
    return exc.value.problems


def test_a_minimal_policy_gets_safe_defaults() -> None:
    (p,) = model.parse_policies(GOOD)
    assert p.mode is model.Mode.ENFORCE and p.level is model.Level.MICRO
    assert p.guards.hold_time == 5.0 and p.trigger.consecutive == 1
    assert p.action.deadline == 0.5 and p.action.rollback_on == [model.Verdict.WORSE]


def test_errors_name_file_line_and_field() -> None:
    text = """\
id: bad
match:
  kinds: [slo_latency, nonsense]
  min_confidence: 2
action:
  operation: set_class_rate
  parameters:
    class_id: 1
    colour: blue
guards:
  hold_time: 5 parsecs
  frequency: {limit: 0, window: 1m}
"""
    problems = errors(text)
    joined = "\n".join(problems)
    assert "p.yaml:3: match.kinds.1: Input should be 'slo_latency'" in joined
    assert "p.yaml:4: match.min_confidence: Input should be less than or equal to 1" in joined
    assert "p.yaml:8: action.parameters.rate_bps: operation set_class_rate needs this" in joined
    assert "p.yaml:9: action.parameters.colour: operation set_class_rate does not take" in joined
    assert "(it takes class_id, rate_bps, ceil_bps)" in joined
    assert "p.yaml:11: guards.hold_time: Value error, '5 parsecs' is not a duration" in joined
    assert "p.yaml:12: guards.frequency.limit: Input should be greater than or equal to 1" in joined


def test_unknown_fields_and_parameters_are_rejected() -> None:
    problems = errors(GOOD + "  colour: blue\nguard: {}\n")
    assert any("p.yaml:6: action.colour: Extra inputs are not permitted" in p for p in problems)
    assert any("p.yaml:7: guard: Extra inputs are not permitted" in p for p in problems)
    problems = errors(GOOD + "  parameters: {class_id: 3}\n")
    assert "does not take this parameter (it takes message)" in problems[0]


POLICY = """\
id: typed
level: {level}
match:
  kinds: [slo_latency]
action:
  operation: {op}
  parameters:
{params}
"""


def policy(op: str, params: dict, level: str = "micro") -> str:
    lines = "".join(f"    {k}: {json.dumps(v)}\n" for k, v in params.items())
    return POLICY.format(op=op, level=level, params=lines.rstrip("\n"))


# Values the node agent (or the engine's own actuator) would refuse, each with the message it
# must produce at validate time.
# Checked against the operation's message (cgloop.v1 Action.spec): types from the descriptor,
# accepted values from its param_rule options; "(rule)" marks the checks across fields or
# beyond a range (parameters._RULES), which the JSON Schema cannot express.
BAD_PARAMETERS = [
    ("reprioritise_flow", {"class_id": "abc"}, ".class_id: should be an integer"),
    ("reprioritise_flow", {"class_id": True}, ".class_id: should be an integer"),
    ("reprioritise_flow", {"class_id": 0x10010, "rewrite_dscp": 99}, ".rewrite_dscp: should be "
     "within 0..63"),
    ("reprioritise_flow", {"class_id": 0x10010, "rewrite_dscp": "46"}, ".rewrite_dscp: should be "
     "an integer"),
    ("reprioritise_flow", {"class_id": 0x10000}, ".class_id: class_id 0x00010000 needs a major "
     "and a non-zero minor (rule)"),
    ("reprioritise_flow", {"class_id": 2**32}, ".class_id: should be within 1..4294967295"),
    ("set_class_rate", {"class_id": 0x10030, "rate_bps": -5}, ".rate_bps: should be within 1.."),
    ("set_class_rate", {"class_id": 0x10030, "rate_bps": 5.5}, ".rate_bps: should be an integer"),
    ("set_class_rate", {"class_id": 0x10030, "rate_bps": 10, "ceil_bps": 5},
     ": ceil_bps 5 is below rate_bps 10 (rule)"),
    ("set_power_policy", {"cores": [2], "min_frequency_khz": 800000, "max_frequency_khz": 0},
     ".max_frequency_khz: should be within 1..4294967295"),
    ("set_power_policy", {"cores": [2], "min_frequency_khz": 9, "max_frequency_khz": 8},
     ": min_frequency_khz 9 is above max_frequency_khz 8 (rule)"),
    ("set_power_policy", {"cores": [-1], "min_frequency_khz": 1, "max_frequency_khz": 2},
     ".cores.0: should be within 0..4294967295"),
    ("set_power_policy", {"cores": [2], "min_frequency_khz": 1, "max_frequency_khz": 2,
                          "xman_mode": "turbo"}, ".xman_mode: should be one of off, load, "
                                                 "feedback, pinned_max"),
    ("set_power_policy", {"cores": [2], "min_frequency_khz": 1, "max_frequency_khz": 2,
                          "latency_critical": [3]},
     ".latency_critical: cores [3] are not among cores (rule)"),
    ("notify", {"message": 5}, ".message: should be a string"),
]
GLOBAL_BAD = [
    ("set_chain", {"chain_id": "c", "traffic_class": "gaming", "functions": ["teleporter"]},
     ".functions.0: 'teleporter' is not a ChainFunction (one of forward, acl"),
    ("set_chain", {"chain_id": "c", "traffic_class": "gaming", "functions": "acl"},
     ".functions: should be a list"),
    ("set_chain", {"chain_id": "c", "traffic_class": "gaming",
                   "functions": [{"mark": {"dscp": 99}}]}, ".functions.0.mark.dscp: should be "
                                                           "within 0..63"),
    ("set_chain", {"chain_id": "c", "traffic_class": "gaming",
                   "functions": [{"acl": {"proto": 17}, "mark": {}}]}, ".functions.0.mark: set "
                                                                       "only one of function"),
    ("onos_flow_rule", {"priority": 70000}, ".priority: should be within 0..65535"),
    ("onos_queue", {"port": "1", "queue_id": -2}, ".queue_id: should be within 0..4294967295"),
    ("onos_meter", {"unit": "kb_per_sec", "bands": [{"type": "drop", "rate": 0}]},
     ".bands.0.rate: should be within 1..18446744073709551615"),
    ("onos_meter", {"unit": "bits", "bands": [{"type": "drop", "rate": 1}]},
     ".unit: should be one of kb_per_sec, pkts_per_sec"),
    ("onos_intent", {"app_id": "a", "priority": 1, "ingress": {"device_id": "of:1", "port": 1},
                     "egress": {"device_id": "of:1", "port": 1}}, ".egress: is the ingress point"),
]


@pytest.mark.parametrize(("op", "params", "message"), BAD_PARAMETERS)
def test_parameter_values_are_type_and_range_checked(op: str, params: dict, message: str) -> None:
    joined = "\n".join(errors(policy(op, params)))
    assert f"action.parameters{message.removesuffix(' (rule)')}" in joined, joined
    if "(rule)" not in message:  # checks across values (ceil >= rate) are beyond the schema
        validator = jsonschema.Draft202012Validator(model.json_schema())
        assert not validator.is_valid(yaml.safe_load(policy(op, params)))


@pytest.mark.parametrize(("op", "params", "message"), GLOBAL_BAD)
def test_global_parameter_values_are_checked(op: str, params: dict, message: str) -> None:
    text = policy(op, params, level="global")
    assert f"action.parameters{message}" in "\n".join(errors(text))
    if "only one of" in message or "ingress point" in message:  # beyond the schema
        return
    assert not jsonschema.Draft202012Validator(model.json_schema()).is_valid(yaml.safe_load(text))


def test_a_bad_value_is_reported_on_its_own_line() -> None:
    problems = errors(policy("reprioritise_flow", {"class_id": 0x10010, "rewrite_dscp": 99}))
    assert problems == [
        "p.yaml:9: action.parameters.rewrite_dscp: should be within 0..63"
    ]


def test_good_parameters_of_every_operation_load() -> None:
    good = {
        "reprioritise_flow": ({"class_id": 0x10010, "rewrite_dscp": 46}, "micro"),
        "protect_flow": ({"latency_slo_ns": 20_000_000, "class_id": 0x10020, "rewrite_dscp": 46,
                          "ttl_ns": 30_000_000_000}, "micro"),
        "set_class_rate": ({"class_id": 0x10030, "rate_bps": 5_000_000}, "micro"),
        "set_power_policy": ({"cores": [2, 3], "min_frequency_khz": 800000,
                              "max_frequency_khz": 2400000, "latency_critical": [2]}, "micro"),
        "set_chain": ({"chain_id": "g", "traffic_class": "gaming",
                       "functions": ["forward", {"dpi": {"hex": "4746", "drop": {}}}],
                       "processing_us": [0, 7], "base_rtt_us": 190}, "global"),
        "onos_flow_rule": ({"priority": 40000, "queue_id": 1, "output_port": "CONTROLLER"},
                           "global"),
        "onos_queue": ({"port": "1", "queue_id": 2, "max_rate_bps": 10**8}, "global"),
        "notify": ({"message": "hello"}, "micro"),
        "onos_meter": ({"unit": "kb_per_sec", "bands": [{"type": "drop", "rate": 10000}]},
                       "global"),
        "onos_intent": ({"app_id": "org.cgloop", "priority": 200,
                         "ingress": {"device_id": "of:1", "port": 1},
                         "egress": {"device_id": "of:2", "port": 2}}, "global"),
    }
    assert set(good) == {o.value for o in model.Operation}
    validator = jsonschema.Draft202012Validator(model.json_schema())
    for op, (params, level) in good.items():
        (p,) = model.parse_policies(policy(op, params, level))
        assert p.action.parameters == params
        validator.validate(yaml.safe_load(policy(op, params, level)))


def test_bounds_name_parameters_of_the_operation_and_hold_its_own_values() -> None:
    text = policy("set_class_rate", {"class_id": 0x10030, "rate_bps": 1000})
    typo = errors(text + "guards:\n  bounds:\n    rate_bsp: {max: 10}\n")
    assert "guards.bounds.rate_bsp: operation set_class_rate has no parameter rate_bsp" in typo[0]
    outside = errors(text + "guards:\n  bounds:\n    rate_bps: {min: 5000}\n")
    assert "the policy's own rate_bps 1000 is outside 5000.0..…" in outside[0]


def test_global_operations_need_the_global_level() -> None:
    text = GOOD.replace(
        "operation: notify", "operation: onos_queue\n  parameters: {port: '1', queue_id: 2}"
    )
    assert "set level: global" in errors(text)[0]


def test_yaml_syntax_and_shape_errors() -> None:
    assert errors("id: [unclosed\n")[0].startswith("p.yaml:2: not valid YAML")
    assert errors("- just\n- a list\n")[0].startswith("p.yaml:1: a policy file is a mapping")


def test_durations() -> None:
    for text, seconds in [("250ms", 0.25), ("2s", 2), ("1m", 60), ("1.5h", 5400), ("20us", 2e-5)]:
        (p,) = model.parse_policies(GOOD + f"guards: {{hold_time: {text}}}\n")
        assert p.guards.hold_time == pytest.approx(seconds)


def test_directory_loading_rejects_duplicate_ids(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(GOOD)
    (tmp_path / "b.yml").write_text(GOOD)
    with pytest.raises(model.PolicyError, match="already defined in"):
        model.load_policies([tmp_path])
    with pytest.raises(model.PolicyError, match="no such file"):
        model.load_policies([tmp_path / "missing.yaml"])


def test_shipped_policies_load_and_cover_both_levels() -> None:
    policies = model.default_policies()
    assert {p.level for p in policies} == {model.Level.MICRO, model.Level.GLOBAL}
    assert {p.action.operation for p in policies} >= {
        model.Operation.REPRIORITISE_FLOW,
        model.Operation.SET_CLASS_RATE,
        model.Operation.SET_CHAIN,
        model.Operation.SET_POWER_POLICY,
        model.Operation.ONOS_FLOW_RULE,
        model.Operation.NOTIFY,
    }


def test_node_only_operations_cannot_be_ordered_and_protections_are_checked() -> None:
    # What only the node's micro loop records (RFC 9957 sanctions, X-MAN's frequency changes).
    for op in ("queue_protection_sanction", "set_core_frequency"):
        (problem,) = errors(POLICY.format(level="micro", op=op, params="    core: 1"))
        assert "p.yaml:6: action.operation: Input should be" in problem
        assert "protect_flow" in problem
    text = POLICY.format(
        level="micro",
        op="protect_flow",
        params="    latency_slo_ns: 50000\n    class_id: 0x10000\n    ttl_ns: 7200000000000",
    )
    joined = "\n".join(errors(text))
    assert "action.parameters.latency_slo_ns: should be within 100000..10000000000" in joined
    assert "action.parameters.ttl_ns: should be within 1000000000..3600000000000" in joined
    text = POLICY.format(
        level="micro", op="protect_flow",
        params="    latency_slo_ns: 20000000\n    class_id: 0x10000\n    ttl_ns: 30000000000",
    )
    assert "class_id 0x00010000 needs a major and a non-zero minor" in "\n".join(errors(text))


def test_published_schema_is_current_and_validates_the_shipped_files() -> None:
    published = json.loads(model.SCHEMA_PATH.read_text())
    assert published == json.loads(json.dumps(model.json_schema())), (
        "policy.schema.json is stale: run `cgloop policy schema --write`"
    )
    validator = jsonschema.Draft202012Validator(published)
    for f in sorted(model.DEFAULTS_DIR.glob("*.yaml")):
        validator.validate(yaml.safe_load(f.read_text()))
    validator.validate(yaml.safe_load(GOOD))
    bad = yaml.safe_load(GOOD.replace("slo_latency", "nonsense"))
    assert not validator.is_valid(bad)
