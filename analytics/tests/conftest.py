"""Shared fixtures for analytics tests: the real data folder and a small trained model."""

from __future__ import annotations

from pathlib import Path

import pytest
from cgloop.analytics.datasets import default_data_root
from cgloop.testing import data_missing

DATA = default_data_root()


def need_data(*parts: str) -> Path:
    """`parts` under the data folder; skips where it is absent, fails in CI (data_missing)."""
    path = DATA.joinpath(*parts)
    if not path.exists():
        data_missing(f"real data not present: {path}")
    return path


@pytest.fixture(scope="session")
def small_examples():
    """Real Xbox captures (background subsampled), nDPI pcaps and 2 synthetic sessions each."""
    from cgloop.analytics.datasets import build_examples, load_all

    need_data("xbox-cloud-gaming")
    flows = load_all(max_background=40, synthetic_per_platform=2)
    return flows, build_examples(flows)


@pytest.fixture(scope="session")
def small_model(small_examples):
    from cgloop.analytics.evaluate import train

    _, ex = small_examples
    return train(ex, n_estimators=60)
