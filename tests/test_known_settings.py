"""The declaration of CGLOOP_* variables (core/src/cgloop/known_settings.toml) equals what the
code reads, and `cgloop` refuses an undeclared one at start, naming it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cgloop.actuators.onos.client import OnosSettings
from cgloop.config import KafkaClientSecurity, Settings, _var
from cgloop.contracts.ops import Daemon
from cgloop.datasets.store.limits import QueryLimits
from cgloop.metrics import env_var
from cgloop.settings_known import known, refusal, suggestion, unknown

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {"target", ".venv", "node_modules", ".git"}
LITERAL = re.compile(r"(?<![A-Za-z0-9_])CGLOOP_[A-Z0-9_]+")
ENV_PREFIX = re.compile(r"env_prefix\s*=\s*[\"'](CGLOOP_[A-Z0-9_]*)[\"']")
RUST_TESTS = re.compile(r"^#\[cfg\(test\)\]\s*mod\s+\w+", re.M)
C_MACRO = re.compile(r"^\s*#\s*define\s+(CGLOOP_[A-Z0-9_]+)", re.M)
# Every pydantic settings class of the project reading CGLOOP_* (their prefixes are checked
# against the sources below, so a new class cannot be missed).
SETTINGS_CLASSES = (Settings, OnosSettings, QueryLimits)


def _is_code(rel: Path) -> bool:
    # The components' sources, build scripts and the benchmarks (which start the daemons with
    # their variables in the environment); not tests, not docs.
    return "src" in rel.parts or rel.name == "build.rs" or rel.parts[0] == "bench"


def _sources(*suffixes: str) -> list[Path]:
    return [
        p
        for p in ROOT.rglob("*")
        if p.suffix in suffixes
        and p.is_file()
        and not SKIP_DIRS.intersection(p.relative_to(ROOT).parts)
        and _is_code(p.relative_to(ROOT))
    ]


def _c_macros() -> set[str]:
    # Names the BPF C headers #define (CGLOOP_MAX_FUNCTIONS, ...): Rust comments cite them, and
    # they are not environment variables.
    found: set[str] = set()
    for p in ROOT.rglob("*"):
        if p.suffix in (".h", ".c") and not SKIP_DIRS.intersection(p.relative_to(ROOT).parts):
            found |= set(C_MACRO.findall(p.read_text(errors="replace")))
    return found


def literals_in_sources() -> set[str]:
    """Every full CGLOOP_* name written in the Python and Rust code (a name ending in `_` is a
    prefix such as CGLOOP_KAFKA_ or the start of a built name: those are read below)."""
    names: set[str] = set()
    for p in _sources(".py", ".rs"):
        text = p.read_text()
        if p.suffix == ".rs":  # a Rust file's unit tests (`#[cfg(test)] mod tests`) are tests
            text = RUST_TESTS.split(text, maxsplit=1)[0]
        names |= {n for n in LITERAL.findall(text) if not n.endswith("_")}
    return names - _c_macros()


def built_names() -> set[str]:
    """Names the code builds rather than writes: pydantic settings fields under their prefix,
    the Kafka security variables, one metrics address per daemon of the ops table."""
    names = {env_var(d) for d in Daemon.values() if d}
    names |= {_var(field) for field in KafkaClientSecurity.model_fields}
    for cls in SETTINGS_CLASSES:
        prefix = cls.model_config["env_prefix"]
        names |= {f"{prefix}{field}".upper() for field in cls.model_fields}
    return names


def test_settings_classes_are_all_listed() -> None:
    in_sources = set()
    for p in _sources(".py"):
        in_sources |= set(ENV_PREFIX.findall(p.read_text()))
    assert in_sources == {cls.model_config["env_prefix"] for cls in SETTINGS_CLASSES}


def test_declaration_equals_what_the_code_reads() -> None:
    read = literals_in_sources() | built_names()
    declared = set(known())
    assert not read - declared, f"read by the code but not declared: {sorted(read - declared)}"
    assert not declared - read, f"declared but read by nothing: {sorted(declared - read)}"


def test_every_entry_says_who_reads_it_and_what_it_means() -> None:
    for name, entry in known().items():
        assert entry.component.strip() and entry.meaning.strip(), name


def test_refusal_names_the_variable_and_the_close_one() -> None:
    env = {"CGLOOP_KAFKA_BOOTSRAP": "x", "CGLOOP_STATE_DIR": "/s", "PATH": "/bin"}
    assert unknown(env) == ["CGLOOP_KAFKA_BOOTSRAP"]
    line = refusal(env)
    assert line is not None and "\n" not in line
    assert "CGLOOP_KAFKA_BOOTSRAP (did you mean CGLOOP_KAFKA_BOOTSTRAP?)" in line
    assert suggestion("CGLOOP_ONOS_USER") == "CGLOOP_ONOS_USERNAME"
    assert suggestion("CGLOOP_LOG_LEVEL") is None
    assert refusal({"CGLOOP_STATE_DIR": "/s"}) is None


def _cgloop(args: list[str], extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CGLOOP_")}
    env.update(extra)
    code = "import sys; from cgloop.cli.main import main; sys.argv[0] = 'cgloop'; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("args", [["--check-config", "sink"], ["--version"], ["--help"]])
def test_cgloop_refuses_an_unknown_setting_before_any_command(args: list[str]) -> None:
    run = _cgloop(args, {"CGLOOP_KAFKA_BOOTSRAP": "broker:9092"})
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stderr.count("\n") == 1
    assert "CGLOOP_KAFKA_BOOTSRAP" in run.stderr
    assert "did you mean CGLOOP_KAFKA_BOOTSTRAP?" in run.stderr
    assert "Traceback" not in run.stderr


def test_cgloop_accepts_every_declared_setting_name(tmp_path: Path) -> None:
    run = _cgloop(
        ["--version"], {name: "" for name in known()} | {"CGLOOP_STATE_DIR": str(tmp_path)}
    )
    assert run.returncode == 0, run.stderr
