"""Finding cgloop's Rust executables (probe exporter, INT collector, node agent).

Python commands wrap the Rust programs of the Cargo workspace. They are looked up in this
order: `CGLOOP_BIN_DIR`, the workspace's `target/release`, `target/debug` (what `make` builds),
then `PATH`. A missing binary is an error that says how to build it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from cgloop.config import find_project_root


class BinaryNotFound(RuntimeError):
    pass


def find_binary(name: str, *, prefer_release: bool = True) -> Path:
    """Path of the Rust executable `name`, or BinaryNotFound naming where it looked."""
    candidates: list[Path] = []
    if bin_dir := os.environ.get("CGLOOP_BIN_DIR"):
        candidates.append(Path(bin_dir) / name)
    root = find_project_root()
    if root is not None:
        target = Path(os.environ.get("CARGO_TARGET_DIR", root / "target"))
        profiles = ["release", "debug"] if prefer_release else ["debug", "release"]
        candidates += [target / profile / name for profile in profiles]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    if found := shutil.which(name):
        return Path(found)
    looked = ", ".join(str(p) for p in candidates) or "(no checkout found)"
    raise BinaryNotFound(
        f"{name} not found (looked in {looked} and PATH); build it with `cargo build --workspace`"
    )
