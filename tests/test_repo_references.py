"""The repository explains itself: every file path that its documents (docs/*.md, README.md)
and its source comments cite exists in the checkout, and none points outside it (the design
notes and papers beside the checkout are cited by name and section, e.g. "CALVIN §III-B").

A reference resolves when the path exists relative to the repository root or to the citing
file's directory, or when it is the tail of a file's path in the repository (a component's
document says `src/tc.rs`). URLs, absolute system paths (/sys, /proc, /etc ...), patterns
(`*`, `<name>`, `{a,b}`, `…`, `NN`) and the few files of other projects cited with their
project (EXTERNAL) are not references to this repository.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Files whose comments are read, by how a comment starts.
SLASH_COMMENTS = {".rs", ".c", ".h", ".proto", ".go", ".js", ".ts"}
HASH_COMMENTS = {".py", ".pyi", ".sh", ".toml", ".yaml", ".yml", ".cfg", ".mk"}
HASH_NAMES = {"Makefile", "Dockerfile"}
DOCS = ("docs/*.md", "README.md")
# Vendored or generated text, not the project's words.
SKIP_PARTS = {".git", ".venv", "target", "node_modules", "__pycache__", "schemas", "vendor"}

# Extensions a cited file has (a token like `TCP/UDP` or `rx/tx` is no file).
EXTENSIONS = (
    "md|rs|py|pyi|c|h|proto|toml|yaml|yml|json|sh|sql|txt|csv|parquet|pcap|pcapng|lock|cfg"
    "|ini|html|ipynb|pem|service|conf|jsonl|bpf\\.c|go|js|ts|mk"
)
PATH_RE = re.compile(
    r"(?<![\w/.$~-])((?:\.\.?/)*(?:[\w.@+-]+/)+[\w.@+-]+\.(?:" + EXTENSIONS + r"))(?![\w/-])"
)
# Documents that live beside the checkout, never in it: cited by name they still point out.
OUTSIDE_RE = re.compile(
    r"(\.\./shared\b|(?<![\w-])seeds/|/work/shared|(?<![\w/.-])(?:design|domain)\.md\b)"
)
# Files of other projects, cited with their project's name on the same line.
EXTERNAL = {
    "include/uapi/linux/pkt_sched.h",  # Linux
    "net/core/sock_reuseport.c",  # Linux
    "linux/filter.h",  # Linux UAPI
    "linux/bpf_common.h",  # Linux UAPI
    "src/data/CHDatasource.ts",  # the ClickHouse Grafana plugin
    "src/types/sql.ts",  # the ClickHouse Grafana plugin
    "pkg/macros/macros.go",  # the ClickHouse Grafana plugin
    "provisioning/datasources/clickhouse.yaml",  # inside the Grafana container
    ".state/policy/journal.jsonl",  # written at run time
}
# The one place that says where the lab's data folder (beside the checkout) is looked for.
DATA_FOLDER_DOC = "docs/sources.md"
URL_RE = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+")
PATTERN_CHARS = set("*<>{}$…%")
PLACEHOLDER_RE = re.compile(r"NN|XX|(?<![\w])[A-Z]/")
SELF = Path(__file__).resolve()


def _all_files() -> set[str]:
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {name for name in out.split("\n") if name}


ALL_FILES = _all_files()


def _files() -> list[Path]:
    files = []
    for name in sorted(ALL_FILES):
        path = ROOT / name
        if SKIP_PARTS.intersection(Path(name).parts) or not path.is_file() or path == SELF:
            continue
        files.append(path)
    return files


def _docs() -> list[Path]:
    seen: set[Path] = set()
    for pattern in DOCS:
        seen.update(ROOT.glob(pattern))
    return sorted(seen)


def _comments(path: Path, text: str) -> list[tuple[int, str]]:
    """(line number, comment text) of each comment line of a source file."""
    suffix = path.suffix
    out: list[tuple[int, str]] = []
    if suffix in SLASH_COMMENTS:
        in_block = False
        for n, line in enumerate(text.split("\n"), 1):
            if in_block:
                out.append((n, line))
                if "*/" in line:
                    in_block = False
                continue
            if "//" in line:
                out.append((n, line[line.index("//") + 2 :]))
            if "/*" in line:
                out.append((n, line[line.index("/*") :]))
                in_block = "*/" not in line[line.index("/*") :]
    elif suffix in HASH_COMMENTS or path.name in HASH_NAMES:
        in_doc = False
        for n, line in enumerate(text.split("\n"), 1):
            stripped = line.strip()
            quotes = stripped.count('"""') + stripped.count("'''")
            if suffix in {".py", ".pyi"} and (in_doc or quotes):
                out.append((n, line))
                if quotes % 2 == 1:
                    in_doc = not in_doc
                continue
            if "#" in line:
                out.append((n, line[line.index("#") + 1 :]))
    return out


def _resolves(ref: str, citing: Path) -> bool:
    if (ROOT / ref).exists() or (citing.parent / ref).exists():
        return True
    tail = "/" + ref.lstrip("./")
    return any(name.endswith(tail) for name in ALL_FILES)


def _problems(path: Path, lines: list[tuple[int, str]]) -> list[str]:
    rel = path.relative_to(ROOT)
    found = []
    for n, line in lines:
        line = URL_RE.sub(" ", line)
        for m in OUTSIDE_RE.finditer(line):
            if m.group(1).endswith(".md") and (ROOT / "docs" / m.group(1)).exists():
                continue
            if str(rel) == DATA_FOLDER_DOC and m.group(1) in ("../shared", "/work/shared"):
                continue
            found.append(f"{rel}:{n}: points outside the repository: {m.group(1)}")
        for m in PATH_RE.finditer(line):
            ref = m.group(1)
            if PATTERN_CHARS.intersection(ref) or "..." in ref.replace("../", ""):
                continue
            if PLACEHOLDER_RE.search(ref) or ref in EXTERNAL:
                continue
            if line[: m.start()].rstrip().endswith(("/sys", "/proc", "/etc", "/usr", "/dev")):
                continue
            if ref.startswith("../shared") or ref.startswith("seeds/"):
                continue  # reported above
            if not _resolves(ref, path):
                found.append(f"{rel}:{n}: no such file in the repository: {ref}")
    return found


def _doc_problems() -> list[str]:
    found = []
    for path in _docs():
        lines = list(enumerate(path.read_text(encoding="utf-8").split("\n"), 1))
        found += _problems(path, lines)
    return found


def _comment_problems() -> list[str]:
    found = []
    for path in _files():
        if path.suffix == ".md":
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        found += _problems(path, _comments(path, text))
    return found


def test_docs_cite_only_files_of_the_repository():
    problems = _doc_problems()
    assert not problems, "\n".join(problems)


def test_source_comments_cite_only_files_of_the_repository():
    problems = _comment_problems()
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("line", "bad"),
    [
        ("// The pcap twin (telemetry/probe/src/flow.rs) applies the same rules.", True),
        ("# background: ../shared/design.md", True),
        ("//! X-MAN (domain.md §5)", True),
        ("# seeds/000_thesis.pdf ch. 4", True),
        ("// The pcap twin (telemetry/probe/src/parse.rs) applies the same rules.", False),
        ("// see https://example.org/a/b.md and /sys/fs/bpf/cgloop/fn_stats.h", False),
        ("// one file per table: migrations/NNNN_*.sql", False),
    ],
)
def test_the_check_catches_what_it_claims(line, bad):
    citing = ROOT / "telemetry" / "bpf" / "flow_probe.bpf.c"
    assert bool(_problems(citing, [(1, line)])) is bad
