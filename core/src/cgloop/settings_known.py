"""The CGLOOP_* variables cgloop reads, declared once in known_settings.toml beside this module
(name, the component that reads it, a one-line meaning).

`cgloop` refuses to start with a CGLOOP_* variable in its environment that is not declared, so
a misspelt setting (a letter missing from CGLOOP_KAFKA_BOOTSTRAP) is an error naming it, not
silently ignored.
tests/test_known_settings.py checks the table against what the Python and Rust sources read.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

PREFIX = "CGLOOP_"
DECLARATION = Path(__file__).with_name("known_settings.toml")
NAME = re.compile(r"^CGLOOP_[A-Z0-9_]*[A-Z0-9]$")


class KnownSetting(BaseModel):
    """One declared variable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    component: str = Field(min_length=1, description="the component that reads it")
    meaning: str = Field(min_length=1, description="what it sets, one line")


_TABLE = TypeAdapter(dict[str, KnownSetting])


@cache
def known() -> dict[str, KnownSetting]:
    """The declaration: variable name -> what reads it and what it means."""
    table = _TABLE.validate_python(tomllib.loads(DECLARATION.read_text(encoding="utf-8")))
    if bad := [name for name in table if not NAME.match(name)]:
        raise ValueError(f"{DECLARATION.name}: not a CGLOOP_* variable name: {', '.join(bad)}")
    return table


def unknown(names: Iterable[str]) -> list[str]:
    """The CGLOOP_* names among `names` (e.g. os.environ) that cgloop does not read, sorted."""
    table = known()
    return sorted(n for n in names if n.startswith(PREFIX) and n not in table)


def suggestion(name: str) -> str | None:
    """The declared variable closest to `name`, if one is close: a declared name it is the start
    of (a name cut short finds the full one), else the most similar one."""
    longer = sorted(k for k in known() if k.startswith(name))
    if longer:
        return min(longer, key=len)
    close = difflib.get_close_matches(name, known(), n=1, cutoff=0.8)
    return close[0] if close else None


def refusal(environ: Mapping[str, str]) -> str | None:
    """One line naming every undeclared CGLOOP_* variable of `environ` (with the close known
    name, if any), or None when there is none."""
    names = unknown(environ)
    if not names:
        return None
    parts = []
    for name in names:
        near = suggestion(name)
        parts.append(f"{name} (did you mean {near}?)" if near else name)
    noun = "setting" if len(names) == 1 else "settings"
    return (
        f"unknown {noun} in the environment: {'; '.join(parts)}; cgloop reads only the "
        f"CGLOOP_* variables declared in cgloop/{DECLARATION.name}"
    )
