"""Splitting a SQL script into statements (ClickHouse's HTTP interface takes one at a time)."""

from __future__ import annotations


def split_statements(script: str) -> list[str]:
    """Split on `;` outside quotes and comments; comment-only statements are dropped."""
    statements: list[str] = []
    current: list[str] = []
    has_code = False
    i, n = 0, len(script)
    while i < n:
        ch = script[i]
        if ch in "'\"`":  # quoted string or identifier; a backslash escapes the next character
            j = i + 1
            while j < n and script[j] != ch:
                j += 2 if script[j] == "\\" else 1
            current.append(script[i : j + 1])
            has_code = True
            i = j + 1
        elif script.startswith("--", i) or ch == "#":
            j = script.find("\n", i)
            j = n if j < 0 else j
            current.append(script[i:j])
            i = j
        elif script.startswith("/*", i):
            j = script.find("*/", i + 2)
            j = n if j < 0 else j + 2
            current.append(script[i:j])
            i = j
        elif ch == ";":
            if has_code:
                statements.append("".join(current).strip())
            current, has_code = [], False
            i += 1
        else:
            current.append(ch)
            has_code = has_code or not ch.isspace()
            i += 1
    if has_code:
        statements.append("".join(current).strip())
    return statements
