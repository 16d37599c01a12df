"""Checks before starting the stack, each failing with a message that says what to do."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from pathlib import Path


class PreflightError(RuntimeError):
    pass


MIN_JAVA = 17


def check_java() -> None:
    java = shutil.which("java")
    if java is None:
        raise PreflightError(
            "Java is missing: the Kafka broker needs Java 17+ "
            "(Debian: apt-get install openjdk-17-jre-headless)"
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)', out)
    if not match or int(match.group(1)) < MIN_JAVA:
        raise PreflightError(f"Java {MIN_JAVA}+ is needed for Kafka, found: {out.splitlines()[:1]}")


def check_disk(path: Path, min_free_mb: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    free_mb = shutil.disk_usage(path).free // (1 << 20)
    if free_mb < min_free_mb:
        raise PreflightError(
            f"disk full: only {free_mb} MiB free under {path}, the stack needs "
            f"at least {min_free_mb} MiB (set CGLOOP_MIN_FREE_DISK_MB to change)"
        )


def check_port_free(host: str, port: int, what: str, env_var: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise PreflightError(
                f"port {host}:{port} for {what} is taken by another process ({exc.strerror}); "
                f"stop it or choose another port with {env_var}"
            ) from None
