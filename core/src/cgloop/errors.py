"""The project-wide error base and the one-line text of an expected error.

`CgloopError` marks a failure the user can act on (bad input, a refused file), not a bug. The
`cgloop` command prints these, and the input errors of the standard library and pydantic, as
one line naming the input, never as a traceback (see `cgloop.cli.main`).
"""

from __future__ import annotations

from pydantic import ValidationError


class CgloopError(Exception):
    """An expected failure whose message says what was wrong and where."""


# What bad input raises: ours, and the standard library's and pydantic's input errors
# (UnicodeDecodeError and pydantic's ValidationError are ValueErrors; EOFError is what a cut
# gzip stream ends in).
INPUT_ERRORS: tuple[type[BaseException], ...] = (CgloopError, ValueError, OSError, EOFError)


def expected(exc: BaseException) -> bool:
    """Bad input, or a failure cgloop raises on purpose with a message (any error class of a
    cgloop module, e.g. StackError, ServiceError): not a bug."""
    if isinstance(exc, INPUT_ERRORS):
        return True
    return any(c.__module__.startswith("cgloop.") for c in type(exc).__mro__)


def one_line(exc: BaseException) -> str:
    """The error as one line that names the input (file, field) when the exception knows it."""
    if isinstance(exc, ValidationError):
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
            for e in exc.errors()
        )
        text = f"invalid {exc.title}: {problems}"
    elif isinstance(exc, UnicodeDecodeError):
        bad = exc.object[exc.start : exc.start + 1]
        text = f"input is not {exc.encoding} text (byte {bad.hex()} at offset {exc.start})"
    elif isinstance(exc, OSError) and exc.filename is not None:
        text = f"{exc.filename}: {exc.strerror or exc}"
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())
