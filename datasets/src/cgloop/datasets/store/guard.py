"""What the read-only endpoint refuses that ClickHouse's own `readonly=1` does not, inside chDB.

`readonly=1` on the reader connection (see `limits.QueryLimits`) already refuses writes, DDL,
temporary tables, every setting change and the table functions that reach outside (`file`,
`url`, `s3`, `remote`, `executable`, `mysql`, … in a SELECT: code 164). chDB runs the engine
as `clickhouse-local`, which lacks what a ClickHouse server would use for the rest: every
connection is the `default` user with all grants (no other user can be selected, so no grants
or settings profile of a restricted user apply), `user_files_path` does not confine absolute
paths, and the *client* side of the engine executes `INTO OUTFILE` and several statements per
query. So five things still get through `readonly=1`, and are refused here:

* more than one statement in a request (the second could be anything: `SELECT 1; SYSTEM …`);
* statements other than SELECT/SHOW/DESCRIBE/EXISTS/EXPLAIN (`SYSTEM`, `KILL QUERY`, `BACKUP`,
  `EXECUTE AS`, … are not writes to `readonly`);
* `INTO OUTFILE` (written by the engine's client code, as root);
* the scalar function `file()`, which reads any path;
* table functions other than the in-process ones in `DESCRIBE`/`EXPLAIN` (schema inference
  opens the file or fetches the URL).

The decision is ClickHouse's parser's, not a hand-written one: the query text goes to
`formatQuery()` as a bound parameter (one statement or a syntax error), then `EXPLAIN AST`
prints its tree, and the rules below read the node names of that tree.
"""

from __future__ import annotations

import re
from typing import Protocol

READONLY = 164
ACCESS_DENIED = 497

# Statement kinds (root node names of EXPLAIN AST) a read-only endpoint runs: every read.
_ALLOWED_ROOTS = ("Select", "Explain", "Show", "Describe", "Exists")
# Table functions that stay inside the engine: generated rows, literal data, local tables.
_LOCAL_TABLE_FUNCTIONS = frozenset(
    {
        "numbers",
        "numbers_mt",
        "zeros",
        "zeros_mt",
        "values",
        "null",
        "format",
        "generaterandom",
        "generate_series",
        "generateseries",
        "primes",
        "view",
        "viewifpermitted",
        "viewexplain",
        "merge",
        "loop",
        "dictionary",
        "mergetreeindex",
        "mergetreeprojection",
    }
)
# Scalar functions that read outside the engine.
_OUTSIDE_FUNCTIONS = frozenset({"file"})
_NODE = re.compile(r"^( *)(\S+)(?: (\S+))?")


class Refused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Connection(Protocol):
    def query(self, sql: str, fmt: str = ..., params: dict | None = ...): ...


def check(conn: _Connection, sql: str, params: dict[str, str] | None = None) -> None:
    """Raise Refused (or the engine's own error: a syntax error) unless `sql` is one statement
    the read-only endpoint may run. `conn` is a readonly=1 reader connection; `params` the
    query's parameters (substituted in the tree, as they will be when it runs)."""
    # One statement: formatQuery parses its argument as exactly one query (a bound parameter,
    # never spliced into SQL), so "SELECT 1; SYSTEM STOP MERGES" is a syntax error here.
    conn.query("SELECT formatQuery({q:String})", "TSV", params={"q": _escaped(sql)})
    # Only one statement, so prefixing EXPLAIN AST cannot run anything: it prints the tree.
    tree = conn.query(f"EXPLAIN AST\n{sql}", "TSVRaw", params=params or None).bytes().decode()
    refuse(tree)


def _escaped(text: str) -> str:
    """`text` as a query parameter value: ClickHouse reads those in its escaped text form."""
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def refuse(tree: str) -> None:
    """Raise Refused if the EXPLAIN AST `tree` (one node a line, indented one space a level)
    holds something the endpoint does not run."""
    lines = [m for m in map(_NODE.match, tree.splitlines()) if m]
    if not lines:
        raise Refused(READONLY, "cannot read the query's syntax tree")
    root = lines[0].group(2)
    if not root.startswith(_ALLOWED_ROOTS):
        raise Refused(
            READONLY,
            f"the store endpoint is read-only: {root} is not run here "
            "(SELECT, SHOW, DESCRIBE, EXISTS and EXPLAIN are)",
        )
    parents: list[tuple[int, str]] = []  # the open ancestors: (depth, node name)
    for match in lines:
        depth, node, name = len(match.group(1)), match.group(2), (match.group(3) or "")
        while parents and parents[-1][0] >= depth:
            parents.pop()
        parent = parents[-1][1] if parents else ""
        # INTO OUTFILE is the only literal hanging directly off a statement (its file name,
        # compression, level): the SELECT's own literals sit deeper, in its expression lists.
        if depth == 1 and node == "Literal":
            raise Refused(ACCESS_DENIED, "INTO OUTFILE is not allowed on the store endpoint")
        if node == "Function":
            function = name.lower()
            if function in _OUTSIDE_FUNCTIONS:
                raise Refused(ACCESS_DENIED, f"function {name}() reads files: not allowed here")
            if parent == "TableExpression" and function not in _LOCAL_TABLE_FUNCTIONS:
                raise Refused(
                    ACCESS_DENIED,
                    f"table function {name}() reaches outside the store: not allowed here",
                )
        parents.append((depth, node))
