"""The engine's journal: every action state change, appended and synced before it is announced.

A restarted engine replays the journal to know which actions exist and where each one stands,
so a detection delivered again after the restart (Kafka is at least once) maps to an action
id it already knows and is not acted on twice, and an action applied before the crash is still
verified (or rolled back) after it.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cgloop.v1 import action_pb2 as apb

log = logging.getLogger(__name__)

FINAL = {
    apb.ACTION_STATE_REFUSED,
    apb.ACTION_STATE_VERIFIED,
    apb.ACTION_STATE_ROLLED_BACK,
    apb.ACTION_STATE_FAILED,
    apb.ACTION_STATE_EXPIRED,
}


@dataclass
class Entry:
    action: apb.Action
    result: apb.ActionResult | None
    target_key: str
    awaiting_approval: bool = False

    @property
    def state(self) -> int:
        return self.result.state if self.result is not None else self.action.state


def _b64(msg: object) -> str:
    return base64.b64encode(msg.SerializeToString(deterministic=True)).decode()  # type: ignore[attr-defined]


class Journal:
    """JSON lines: {"action": b64 Action, "result": b64 ActionResult|null, "target": key}."""

    def __init__(self, path: Path | None, fsync: bool = True) -> None:
        self.path = path
        self.fsync = fsync
        self.entries: dict[str, Entry] = {}
        self.order: list[str] = []
        self._open: dict[str, None] = {}  # ids not yet final, in decision order
        self._dirty = False
        self._fh = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            for entry in self._read(path):
                self._remember(entry)
            self._fh = path.open("a", encoding="utf-8")

    @staticmethod
    def _read(path: Path) -> Iterator[Entry]:
        if not path.exists():
            return
        with path.open(encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                try:
                    row = json.loads(line)
                    action = apb.Action.FromString(base64.b64decode(row["action"]))
                    result = (
                        apb.ActionResult.FromString(base64.b64decode(row["result"]))
                        if row.get("result")
                        else None
                    )
                    yield Entry(action, result, row["target"], bool(row.get("approval")))
                except (ValueError, KeyError) as exc:
                    # A torn last line after a crash: everything before it is intact.
                    log.warning("journal %s line %d unreadable (%s); skipped", path, n, exc)

    def _remember(self, entry: Entry) -> None:
        if entry.action.id not in self.entries:
            self.order.append(entry.action.id)
        self.entries[entry.action.id] = entry
        if entry.state in FINAL:
            self._open.pop(entry.action.id, None)
        else:
            self._open[entry.action.id] = None

    def record(self, entry: Entry) -> None:
        self._remember(entry)
        if self._fh is None:
            return
        row = {
            "action": _b64(entry.action),
            "result": _b64(entry.result) if entry.result is not None else None,
            "target": entry.target_key,
            "approval": entry.awaiting_approval,
        }
        self._fh.write(json.dumps(row) + "\n")
        self._dirty = True

    def sync(self) -> None:
        """Make everything recorded so far durable (group commit, once per detection batch).

        Called before events are published and offsets committed. An action applied but not
        yet synced when the process dies is decided again under the same id after the restart,
        and the actuator's idempotency key turns the second apply into a replay.
        """
        if self._fh is None or not self._dirty:
            return
        self._fh.flush()
        if self.fsync:
            os.fsync(self._fh.fileno())
        self._dirty = False

    def get(self, action_id: str) -> Entry | None:
        return self.entries.get(action_id)

    def open_entries(self) -> list[Entry]:
        return [self.entries[i] for i in self._open]

    def close(self) -> None:
        self.sync()
        if self._fh is not None:
            self._fh.close()
            self._fh = None
