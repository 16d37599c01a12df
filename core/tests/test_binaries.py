from __future__ import annotations

import os
from pathlib import Path

import pytest
from cgloop.binaries import BinaryNotFound, find_binary


def test_bin_dir_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = tmp_path / "cgloop-thing"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setenv("CGLOOP_BIN_DIR", str(tmp_path))
    assert find_binary("cgloop-thing") == exe


def test_missing_binary_says_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CGLOOP_BIN_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BinaryNotFound) as err:
        find_binary("cgloop-nope")
    assert str(tmp_path / "cgloop-nope") in str(err.value)
    assert "cargo build" in str(err.value)


def test_not_executable_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cgloop-plain").write_text("data")
    monkeypatch.setenv("CGLOOP_BIN_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", os.defpath)
    with pytest.raises(BinaryNotFound):
        find_binary("cgloop-plain")
