"""What a lab created, on disk, written before each thing is created.

`down` trusts this file first and then also scans for the lab's namespaces and the processes
inside them, so a run killed at any point (even between creating a namespace and recording a
process) is still cleaned up completely.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cgloop.lab.topology import Topology
from pydantic import BaseModel, Field


def default_state_dir() -> Path:
    from cgloop.config import settings

    return settings().state_dir / "lab"


class ProcRecord(BaseModel):
    pid: int
    ticks: int | None = Field(description="start time in clock ticks: guards against pid reuse")
    netns: str | None
    role: str


class LabState(BaseModel):
    name: str
    topology: Topology
    namespaces: list[str] = Field(default_factory=list)
    processes: list[ProcRecord] = Field(default_factory=list)


class StateStore:
    """`<dir>/<lab>.json`, read-modify-written under an flock so concurrent commands agree."""

    def __init__(self, state_dir: Path, name: str) -> None:
        self.dir = Path(state_dir)
        self.name = name
        self.path = self.dir / f"{name}.json"
        self.run_dir = self.dir / name

    def load(self) -> LabState | None:
        try:
            return LabState.model_validate_json(self.path.read_text())
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise ValueError(f"{self.path}: unreadable lab state ({exc}); remove it") from exc

    @contextmanager
    def edit(self, topology: Topology) -> Iterator[LabState]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / f".{self.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = self.load() or LabState(name=self.name, topology=topology)
            yield state
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(state.model_dump(mode="json"), indent=1))
            os.replace(tmp, self.path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        (self.dir / f".{self.name}.lock").unlink(missing_ok=True)
