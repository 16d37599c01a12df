"""Mutation testing of the parts whose tests must catch what they claim (issue 18).

Python targets run mutmut 3 in a scratch copy (.cache/mutation/<target>/): the component's
`src/` and `tests/` are copied there with a pyproject.toml that tells mutmut what to mutate and
which tests to run, so the work tree is never edited and other work in it goes on undisturbed.
Rust targets run cargo-mutants (installed into .cache/cargo-mutants by this script, pinned,
once) on the named files of one crate; it too mutates a copy of the source tree.

    uv run python bench/mutation/mutation.py detectors            # one target
    uv run python bench/mutation/mutation.py --all                # everything (hours)
    uv run python bench/mutation/mutation.py --report-only        # re-read earlier results

Prints, per module, the surviving mutants and the kill rate, and rewrites bench/mutation/
REPORT.md from the results of every target run so far. Not part of CI: a full run takes hours
on two cores (make test would spend its whole budget here).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "mutation"
RESULTS = CACHE / "results"
REPORT = Path(__file__).resolve().parent / "REPORT.md"
CARGO_MUTANTS_VERSION = "27.1.0"
CARGO_MUTANTS_ROOT = ROOT / ".cache" / "cargo-mutants"

# mutmut exit-code classes (mutmut.stats.status_by_exit_code): what counts as caught.
CAUGHT = {"killed", "timeout", "caught by type check", "segfault"}
MISSED = {"survived", "no tests"}


@dataclass
class PyTarget:
    name: str
    component: str  # folder holding src/ and tests/
    mutate: list[str]  # globs under the component, for mutmut's only_mutate
    tests: list[str]  # test files under the component's tests/
    # Where the tests start child processes that import the code (the sink runs in the store
    # process), those processes must import the mutated copy too.
    child_processes: bool = False


@dataclass
class RustTarget:
    name: str
    package: str
    files: list[str]  # relative to ROOT
    args: list[str] = field(default_factory=list)  # more cargo-mutants options


PY_TARGETS = {
    t.name: t
    for t in (
        PyTarget(
            "detectors",
            "analytics",
            ["src/cgloop/analytics/detectors/*"],
            # The detectors' unit tests; the engine- and capture-level tests (test_detectors.py,
            # test_detectors_jitter.py, test_engine.py) train a model or read pcaps per run,
            # seconds per mutant, and only add kills.
            [
                "test_detectors_base.py",
                "test_detectors_l4s.py",
                "test_detectors_overload.py",
                "test_detectors_slo.py",
            ],
        ),
        PyTarget(
            "policy-engine",
            "policy-engine",
            ["src/cgloop/policy/*"],
            ["test_*.py"],
        ),
        PyTarget(
            "sink",
            "datasets",
            ["src/cgloop/datasets/sink/*"],
            ["test_sink*.py", "test_writer.py"],
            child_processes=True,
        ),
    )
}
RUST_TARGETS = {
    t.name: t
    for t in (
        RustTarget(
            "node-agent-validation",
            "cgloop-node-agent",
            ["actuators/node-agent/src/bounds.rs", "actuators/node-agent/src/chains.rs"],
        ),
        RustTarget(
            "int-parser",
            "cgloop-int-collector",
            ["telemetry/int-collector/src/parse/*.rs"],
            # The parser needs no Kafka: skip building librdkafka in every scratch copy. Its
            # tests are the library's and the golden/events/steer suites; sources.rs runs the
            # binary, which needs Kafka.
            [
                "--no-default-features",
                "--",
                "--lib",
                "--test",
                "golden",
                "--test",
                "events",
                "--test",
                "steer",
            ],
        ),
    )
}


@dataclass
class ModuleResult:
    caught: int = 0
    missed: int = 0
    other: dict[str, int] = field(default_factory=dict)
    survivors: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float | None:
        judged = self.caught + self.missed
        return self.caught / judged if judged else None


# --- mutmut ----------------------------------------------------------------------------------


def _py_scratch(t: PyTarget) -> Path:
    work = CACHE / t.name
    comp = ROOT / t.component
    # A fresh copy every run: results of an earlier copy's tests must not be reused.
    if (work / "mutants").exists():
        shutil.rmtree(work / "mutants")
    # The whole component: tests read its other folders too (policy-engine's examples/).
    extra = []
    for entry in sorted(comp.iterdir()):
        if entry.name.startswith(".") or entry.name in ("__pycache__", "pyproject.toml"):
            continue
        if (work / entry.name).is_dir():
            shutil.rmtree(work / entry.name)
        if entry.is_dir():
            skip = shutil.ignore_patterns("__pycache__", ".pytest_cache")
            shutil.copytree(entry, work / entry.name, ignore=skip)
        else:
            shutil.copy2(entry, work / entry.name)
        if entry.name not in ("src", "tests"):
            extra.append(entry.name)
    # The fixtures every test folder shares (free ports, a store server, the stack).
    shutil.copy2(ROOT / "conftest.py", work / "conftest.py")
    tests = sorted({str(p.relative_to(work)) for g in t.tests for p in (work / "tests").glob(g)})
    config = f"""\
        [tool.mutmut]
        source_paths = ["src"]
        only_mutate = {json.dumps(t.mutate)}
        also_copy = {json.dumps(["conftest.py", *extra])}
        pytest_add_cli_args_test_selection = {json.dumps(tests)}
        pytest_add_cli_args = ["-p", "no:cacheprovider", "-q"]

        [tool.pytest.ini_options]
        addopts = "--import-mode=importlib"
        timeout = 300
        markers = ["root: needs root", "kafka: uses the real Kafka broker"]
        """
    (work / "pyproject.toml").write_text(textwrap.dedent(config))
    return work


def run_mutmut(t: PyTarget, max_children: int, budget_s: float | None) -> None:
    work = _py_scratch(t)
    env = dict(os.environ)
    if t.child_processes:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(work / "mutants" / "src"), env.get("PYTHONPATH", "")]
        )
    # The tests find the repository's data and tools through cgloop.testing.ROOT, which stays
    # the work tree; the copy only replaces the code under test.
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children)]
    _run(t.name, cmd, work, env, budget_s)
    _save(t.name, read_mutmut(work), tool="mutmut")


def _run(name: str, cmd: list[str], cwd: Path, env: dict[str, str] | None, budget_s) -> None:
    print(f"[{name}] {' '.join(cmd)} in {cwd}", flush=True)
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, start_new_session=True)
    try:
        proc.wait(timeout=budget_s)
    except subprocess.TimeoutExpired:
        # Out of time: stop, and count what was checked (the rest stays "not checked").
        print(f"[{name}] time budget of {budget_s:.0f} s spent; stopping", flush=True)
        os.killpg(proc.pid, 15)
        proc.wait()


def read_mutmut(work: Path) -> dict[str, ModuleResult]:
    sys.path.insert(0, str(work))  # mutmut's status table only; nothing of ours is imported
    from mutmut.stats import status_by_exit_code

    out: dict[str, ModuleResult] = {}
    for meta in sorted((work / "mutants").rglob("*.py.meta")):
        module = str(meta.relative_to(work / "mutants"))[: -len(".meta")]
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        r = out.setdefault(module, ModuleResult())
        for key, code in sorted(codes.items()):
            status = status_by_exit_code[code]
            if status in CAUGHT:
                r.caught += 1
            elif status in MISSED:
                r.missed += 1
                r.survivors.append(f"{key} ({status})")
            else:
                r.other[status] = r.other.get(status, 0) + 1
    return out


# --- cargo-mutants ---------------------------------------------------------------------------


def cargo_mutants() -> Path:
    """cargo-mutants, pinned, under .cache (installed once; never on make run's path)."""
    exe = CARGO_MUTANTS_ROOT / "bin" / "cargo-mutants"
    have = (
        subprocess.run([exe, "mutants", "--version"], capture_output=True, text=True)
        if exe.exists()
        else None
    )
    if have is None or CARGO_MUTANTS_VERSION not in have.stdout:
        print(f"installing cargo-mutants {CARGO_MUTANTS_VERSION} into {CARGO_MUTANTS_ROOT}")
        subprocess.run(
            [
                "cargo",
                "install",
                "cargo-mutants",
                "--version",
                CARGO_MUTANTS_VERSION,
                "--locked",
                "--root",
                str(CARGO_MUTANTS_ROOT),
                "--quiet",
            ],
            check=True,
        )
    return exe


def run_cargo_mutants(t: RustTarget, budget_s: float | None, shard: str | None) -> None:
    exe = cargo_mutants()
    out = CACHE / t.name
    out.mkdir(parents=True, exist_ok=True)
    cmd = [str(exe), "mutants", "--package", t.package, "--output", str(out), "--jobs", "1"]
    for f in t.files:
        cmd += ["--file", f]
    if shard:  # a systematic sample: every N-th mutant (each takes a build)
        cmd += ["--shard", shard, "--sharding", "round-robin"]
    cmd += t.args
    _run(t.name, cmd, ROOT, None, budget_s)
    _save(t.name, read_cargo_mutants(out / "mutants.out"), tool="cargo-mutants")


def read_cargo_mutants(folder: Path) -> dict[str, ModuleResult]:
    out: dict[str, ModuleResult] = {}
    outcomes = folder / "outcomes.json"
    if not outcomes.exists():
        return out
    for o in json.loads(outcomes.read_text()).get("outcomes", []):
        scenario = o.get("scenario")
        if not isinstance(scenario, dict) or "Mutant" not in scenario:
            continue  # the baseline build
        m = scenario["Mutant"]
        r = out.setdefault(m["file"], ModuleResult())
        summary = o.get("summary")
        if summary in ("CaughtMutant", "Timeout"):
            r.caught += 1
        elif summary == "MissedMutant":
            r.missed += 1
            span = m.get("span", {}).get("start", {})
            what = m.get("replacement", "")
            func = (m.get("function") or {}).get("function_name", "")
            r.survivors.append(
                f"{m['file']}:{span.get('line', '?')}: {func}: {m.get('genre', '')} -> {what}"
            )
        else:
            r.other[str(summary)] = r.other.get(str(summary), 0) + 1
    return out


# --- results and report ----------------------------------------------------------------------


def _save(target: str, results: dict[str, ModuleResult], tool: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = {
        "target": target,
        "tool": tool,
        "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "modules": {m: r.__dict__ for m, r in results.items()},
    }
    (RESULTS / f"{target}.json").write_text(json.dumps(data, indent=1))
    print_target(data)


def _totals(modules: dict[str, dict]) -> ModuleResult:
    total = ModuleResult()
    for r in modules.values():
        total.caught += r["caught"]
        total.missed += r["missed"]
    return total


def _pct(rate: float | None) -> str:
    return "n/a" if rate is None else f"{100 * rate:.1f} %"


def print_target(data: dict) -> None:
    print(f"\n== {data['target']} ({data['tool']}, {data['finished']})")
    for module, r in data["modules"].items():
        res = ModuleResult(r["caught"], r["missed"], r["other"], r["survivors"])
        print(
            f"  {module}: {res.caught} caught, {res.missed} missed, kill rate {_pct(res.rate)}"
            + (f", other {res.other}" if res.other else "")
        )
        for s in res.survivors:
            print(f"    survived: {s}")
    total = _totals(data["modules"])
    print(f"  TOTAL kill rate {_pct(total.rate)} ({total.caught}/{total.caught + total.missed})")


def write_report() -> None:
    lines = [
        "# Mutation testing: surviving mutants and kill rates",
        "",
        "Written by `bench/mutation/mutation.py` (see its docstring); one section per target, "
        "from the last run of that target. Kill rate = caught / (caught + missed), where caught "
        "is killed or timed out and missed is survived or covered by no test; mutants not "
        "checked (a run stopped at its time budget) are counted under *other*.",
        "",
    ]
    for path in sorted(RESULTS.glob("*.json")) if RESULTS.exists() else []:
        data = json.loads(path.read_text())
        total = _totals(data["modules"])
        lines += [
            f"## {data['target']} ({data['tool']}, run {data['finished']})",
            "",
            f"Kill rate **{_pct(total.rate)}** ({total.caught} of {total.caught + total.missed}).",
            "",
            "| module | caught | missed | kill rate | other |",
            "| --- | ---: | ---: | ---: | --- |",
        ]
        for module, r in data["modules"].items():
            res = ModuleResult(r["caught"], r["missed"], r["other"], r["survivors"])
            other = ", ".join(f"{k}: {v}" for k, v in res.other.items()) or ""
            lines.append(
                f"| `{module}` | {res.caught} | {res.missed} | {_pct(res.rate)} | {other} |"
            )
        survivors = [s for r in data["modules"].values() for s in r["survivors"]]
        if survivors:
            lines += ["", "Surviving mutants:", ""] + [f"- `{s}`" for s in survivors]
        lines.append("")
    REPORT.write_text("\n".join(lines))
    print(f"\nwrote {REPORT.relative_to(ROOT)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("targets", nargs="*", help=f"of {[*PY_TARGETS, *RUST_TARGETS]}")
    ap.add_argument("--all", action="store_true", help="every target")
    ap.add_argument("--report-only", action="store_true", help="only rewrite REPORT.md")
    ap.add_argument("--jobs", type=int, default=2, help="mutmut's parallel children")
    ap.add_argument("--budget", type=float, default=None, help="seconds per target, then stop")
    ap.add_argument("--rust-shard", help="K/N: cargo-mutants runs every N-th mutant from K")
    args = ap.parse_args()
    targets = [*PY_TARGETS, *RUST_TARGETS] if args.all else args.targets
    if not args.report_only:
        if not targets:
            ap.error("name a target or pass --all")
        unknown = set(targets) - {*PY_TARGETS, *RUST_TARGETS}
        if unknown:
            ap.error(f"unknown targets {sorted(unknown)}; have {[*PY_TARGETS, *RUST_TARGETS]}")
        for name in targets:
            if name in PY_TARGETS:
                run_mutmut(PY_TARGETS[name], args.jobs, args.budget)
            else:
                run_cargo_mutants(RUST_TARGETS[name], args.budget, args.rust_shard)
    write_report()


if __name__ == "__main__":
    main()
