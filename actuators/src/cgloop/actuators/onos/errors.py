"""Errors of the ONOS driver; none of them carries credentials."""

from __future__ import annotations


class OnosError(Exception):
    """Base class of the driver's errors."""


class OnosValidationError(OnosError):
    """A request body the driver built breaks ONOS's schema or codec rules; nothing was sent."""


class OnosRequestError(OnosError):
    """ONOS refused the request (4xx): retrying cannot help."""

    def __init__(self, method: str, path: str, status: int, message: str) -> None:
        super().__init__(f"{method} {path}: ONOS answered {status}: {message}")
        self.status = status
        self.message = message


class OnosServerError(OnosError):
    """ONOS failed (5xx); retried with backoff."""

    def __init__(self, method: str, path: str, status: int, message: str) -> None:
        super().__init__(f"{method} {path}: ONOS answered {status}: {message}")
        self.status = status


class OnosUnavailableError(OnosError):
    """Retries exhausted on connection errors or 5xx answers."""
