"""cgloop.slo: the SLO table's model, lookups and refusals (the packaged file and its
consumers are checked in tests/test_slo_table.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cgloop.errors import CgloopError
from cgloop.slo import GENERIC, LAB, SloTable, load, table

PLATFORM = {"latency_ms": 60.0, "jitter_ms": 5.0, "loss": 0.05, "min_down_mbps": 8.0}


def _table(**deployments: dict) -> SloTable:
    return SloTable.model_validate({
        "platforms": {
            GENERIC: {"title": "any", "source": "named default", **PLATFORM},
            "gfn": {"title": "GeForce NOW", "source": "MOSAICO D234 §2.1",
                    **PLATFORM, "latency_ms": 100.0, "jitter_ms": 2.0},
        },
        "deployments": {
            n: {"title": n, "source": "named default", **d} for n, d in deployments.items()
        },
    })  # fmt: skip


def test_a_platform_without_a_profile_gets_generic() -> None:
    t = _table()
    assert t.platform("gfn").latency_ms == 100.0
    assert t.platform("nobody-knows") == t.platform("") == t.platforms[GENERIC]


def test_a_deployment_replaces_only_what_it_sets() -> None:
    t = _table(site={"latency_ms": 20.0})
    gfn = t.objectives("gfn", "site")
    assert (gfn.latency_ms, gfn.jitter_ms, gfn.loss) == (20.0, 2.0, 0.05)
    assert gfn.latency_ns == 20_000_000
    assert t.objectives("gfn") == t.platforms["gfn"]
    assert t.latency_ms("site") == 20.0


def test_refusals_name_what_was_wrong() -> None:
    with pytest.raises(CgloopError, match=r"no SLO deployment profile 'x' \(known: site\)"):
        _table(site={"latency_ms": 20.0}).objectives("gfn", "x")
    with pytest.raises(CgloopError, match="'site' sets no latency objective"):
        _table(site={"loss": 0.01}).latency_ms("site")
    with pytest.raises(ValueError, match=r"deployments\.site: sets no objective"):
        _table(site={})
    with pytest.raises(ValueError, match="gfn: both a platform and a deployment"):
        _table(gfn={"latency_ms": 20.0})
    with pytest.raises(ValueError, match="loss"):
        _table(site={"loss": 1.5})


def test_load_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "none.toml"
    with pytest.raises(CgloopError, match=f"{missing}: cannot read the SLO table"):
        load(missing)
    bad = tmp_path / "bad.toml"
    bad.write_text('[platforms.generic]\ntitle = "x"\nsource = "y"\nlatency_ms = "fast"\n')
    with pytest.raises(CgloopError, match=r"bad.toml: invalid SLO table: platforms.generic"):
        load(bad)


def test_the_packaged_table_has_the_lab_profile() -> None:
    assert table().latency_ms(LAB) < min(p.latency_ms for p in table().platforms.values())
