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
    assert "p.yaml:6: action: Value error, operation set_class_rate needs parameters: rate_bps" in (
        joined
    )
    assert "p.yaml:11: guards.hold_time: Value error, '5 parsecs' is not a duration" in joined
    assert "p.yaml:12: guards.frequency.limit: Input should be greater than or equal to 1" in joined


def test_unknown_fields_and_parameters_are_rejected() -> None:
    problems = errors(GOOD + "  colour: blue\nguard: {}\n")
    assert any("p.yaml:6: action.colour: Extra inputs are not permitted" in p for p in problems)
    assert any("p.yaml:7: guard: Extra inputs are not permitted" in p for p in problems)
    problems = errors(GOOD + "  parameters: {class_id: 3}\n")
    assert "does not take parameters: class_id (it takes message)" in problems[0]


def test_global_operations_need_the_global_level() -> None:
    text = GOOD.replace(
        "operation: notify", "operation: onos_queue\n  parameters: {port: 1, queue_id: 2}"
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
