"""The dashboards' JSON: deterministic, checked in as built, well-formed for Grafana."""

from __future__ import annotations

import json
from pathlib import Path

import typer
import yaml
from cgloop.dashboards.alerts import PROMETHEUS_TYPE, PROMETHEUS_UID, RULES_FILE
from cgloop.dashboards.build import DASHBOARDS, PROVISIONED, render, render_all
from cgloop.dashboards.clickhouse import DATASOURCE_TYPE, DATASOURCE_UID
from cgloop.dashboards.commands import register
from cgloop.testing import ROOT
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard
from typer.testing import CliRunner


def test_build_is_deterministic_and_the_checked_in_json_is_the_build() -> None:
    first, second = render_all(), render_all()
    assert first == second
    assert sorted(first) == sorted([*(f"{stem}.json" for stem in DASHBOARDS), RULES_FILE])
    on_disk = _files(PROVISIONED)
    # A difference here means: run `cgloop dashboards build` and commit the result.
    assert on_disk == first


def _files(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): p.read_text()
        for p in folder.rglob("*")
        if p.is_file() and p.name != "README.md"
    }


def _dashboards() -> dict[str, str]:
    return render()


def test_the_json_parses_back_into_the_sdk_dashboard_model_unchanged() -> None:
    for name, text in _dashboards().items():
        model = json.loads(text)
        again = json.loads(json.dumps(Dashboard.from_json(model), cls=JSONEncoder))
        for panel in again["panels"]:  # the one normalisation render() applies
            panel["options"] = panel.get("options") or {}
        # The SDK models an annotation's target as the built-in data source's only (tags,
        # limit); ours are ClickHouse queries (test_noc_features.py checks them).
        for ann in [m.get("annotations", {}).get("list", []) for m in (again, model)]:
            for a in ann:
                a.pop("target", None)
        assert again == model, name


def test_panels_use_the_provisioned_clickhouse_data_source_and_have_unique_ids() -> None:
    provisioned = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/clickhouse.yaml").read_text()
    )["datasources"][0]
    assert (provisioned["uid"], provisioned["type"]) == (DATASOURCE_UID, DATASOURCE_TYPE)
    uids = set()
    for name, text in _dashboards().items():
        model = json.loads(text)
        uids.add(model["uid"])
        ids = [p["id"] for p in model["panels"]]
        assert len(ids) == len(set(ids)), name
        # problems are reported by panel title, so titles must tell panels apart
        titles = [p["title"] for p in model["panels"]]
        assert len(titles) == len(set(titles)), name
        for panel in model["panels"]:
            assert panel["targets"], (name, panel["title"])
            if name == "pipeline-health.json":  # the daemons' metrics, through Prometheus
                assert panel["datasource"] == {"type": PROMETHEUS_TYPE, "uid": PROMETHEUS_UID}
                for target in panel["targets"]:
                    assert target["datasource"] == panel["datasource"] and target["expr"]
                continue
            assert panel["datasource"] == {"type": DATASOURCE_TYPE, "uid": DATASOURCE_UID}
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == DATASOURCE_UID
                assert target["editorType"] == "sql" and target["rawSql"].startswith("SELECT")
            pos = panel["gridPos"]
            assert pos["x"] + pos["w"] <= 24, (name, panel["title"])
        for var in model.get("templating", {}).get("list", []):
            if var["type"] == "query":
                assert var["datasource"]["uid"] == DATASOURCE_UID
    assert len(uids) == len(DASHBOARDS)


def test_cli_build_writes_the_folder_and_check_finds_a_stale_file(tmp_path: Path) -> None:
    app = typer.Typer()
    register(app)
    cli = CliRunner()
    out = tmp_path / "dash"
    built = cli.invoke(app, ["dashboards", "build", "--out", str(out)])
    assert built.exit_code == 0, built.output
    assert _files(out) == render_all()
    assert cli.invoke(app, ["dashboards", "build", "--out", str(out), "--check"]).exit_code == 0
    (out / "nodes.json").write_text("{}")
    stale = cli.invoke(app, ["dashboards", "build", "--out", str(out), "--check"])
    assert stale.exit_code == 1
    assert "nodes.json differs from the build" in " ".join(stale.output.split())
