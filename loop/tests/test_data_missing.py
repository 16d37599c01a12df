"""A test whose data is absent skips on a developer's machine and fails in CI (CI=true), so a
CI run without the lab's data folder cannot pass by skipping the classifier gate, the L4S tests
and the end-to-end test."""

from __future__ import annotations

import pytest
from cgloop.testing import data_missing


@pytest.mark.parametrize("ci", ["true", "1", "TRUE"])
def test_missing_data_fails_in_ci(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match=r"CI=true and no pcaps here .*is missing"):
        data_missing("no pcaps here")


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_missing_data_skips_elsewhere_saying_why(
    monkeypatch: pytest.MonkeyPatch, ci: str | None
) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match=r"no pcaps here \(the lab's data folder"):
        data_missing("no pcaps here")
