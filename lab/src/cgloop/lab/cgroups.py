"""A cgroup v2 directory per lab node, holding that node's processes.

Every emulated node shares the machine's cores, so a node agent reading `/proc/stat` charges
its node with the whole machine's load (a CPU hog on edge2 reads as an overload of every
node). The lab therefore starts each node's processes in `<unified mount>/cgloop-<lab>/<node>`,
and each node agent measures only its cgroup's share of every core (its `[cpu_accounting]
cgroup`). Membership is all that is used: no controller is enabled, nothing is limited.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

log = logging.getLogger(__name__)


def mount(mounts: Path = Path("/proc/self/mounts")) -> Path | None:
    """The unified hierarchy's mount point (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on
    a hybrid machine), None without one."""
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def lab_dir(lab: str, root: Path | None = None) -> Path | None:
    root = root or mount()
    return root / f"cgloop-{lab}" if root is not None else None


def ensure(lab: str, nodes: list[str], root: Path | None = None) -> dict[str, Path]:
    """Create the lab's directory and one per node (idempotent); {} when the machine has no
    cgroup v2 mount or refuses (not root): the agents then read `/proc/stat`."""
    base = lab_dir(lab, root)
    if base is None:
        log.warning("no cgroup v2 mount: every lab node reads the machine's CPU load")
        return {}
    try:
        for node in nodes:
            (base / node).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("lab cgroups under %s: %s; every lab node reads the machine's CPU load",
                    base, exc)
        return {}
    return {node: base / node for node in nodes}


def join(directory: Path) -> None:
    """Move the calling process into `directory` (between fork and exec: what it then runs and
    forks stays there)."""
    (directory / "cgroup.procs").write_text("0")


def remove(lab: str, root: Path | None = None) -> None:
    """Remove the lab's cgroups once their processes are gone; one still holding a process is
    left, with a warning (the next `up` reuses it)."""
    base = lab_dir(lab, root)
    if base is None or not base.is_dir():
        return
    for child in [p for p in base.iterdir() if p.is_dir()]:
        try:
            child.rmdir()
        except OSError as exc:
            log.warning("lab cgroup %s not removed: %s", child, exc)
    with contextlib.suppress(OSError):
        base.rmdir()
