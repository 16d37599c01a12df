"""Installs the Kafka broker jars from Maven Central into the project cache, once.

`python -m cgloop.stack.kafka_install` is idempotent: a completed install leaves a stamp that
names the pom it came from, so a changed pom (new Kafka version) installs again.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

from cgloop.config import settings


def pom_text() -> str:
    return files("cgloop.stack").joinpath("kafka/pom.xml").read_text()


def kafka_home(cache_dir: Path | None = None) -> Path:
    digest = hashlib.sha256(pom_text().encode()).hexdigest()[:12]
    return (cache_dir or settings().cache_dir) / "kafka" / digest


def libs_dir(cache_dir: Path | None = None) -> Path:
    return kafka_home(cache_dir) / "libs"


def is_installed(cache_dir: Path | None = None) -> bool:
    return (kafka_home(cache_dir) / ".complete").is_file()


def install(cache_dir: Path | None = None, quiet: bool = True) -> Path:
    home = kafka_home(cache_dir)
    if is_installed(cache_dir):
        return home
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError(
            "Maven (mvn) is missing: install it (Debian package 'maven') to fetch Kafka"
        )
    home.mkdir(parents=True, exist_ok=True)
    (home / "pom.xml").write_text(pom_text())
    repo = (cache_dir or settings().cache_dir) / "m2"  # keep Maven's cache inside the project
    cmd = [
        mvn,
        "-B",
        "-f",
        str(home / "pom.xml"),
        f"-Dmaven.repo.local={repo}",
        "dependency:copy-dependencies",
        f"-DoutputDirectory={home / 'libs'}",
    ]
    if quiet:
        cmd.insert(1, "-q")
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(
            f"fetching Kafka jars failed ({' '.join(cmd)}):\n"
            f"{result.stdout[-3000:]}{result.stderr[-2000:]}"
        )
    if not any((home / "libs").glob("kafka_2.13-*.jar")):
        raise RuntimeError(f"Maven finished but no kafka_2.13 jar is in {home / 'libs'}")
    (home / ".complete").write_text("ok\n")
    return home


def main() -> int:
    if is_installed():
        return 0
    print(f"[bootstrap] kafka: fetching broker jars into {kafka_home()}", flush=True)
    try:
        install()
    except RuntimeError as exc:
        print(f"kafka install: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
