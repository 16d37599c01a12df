"""The engine's journal: every action state change, appended and synced before it is announced.

Group commit: `record` only queues the row; a writer thread appends everything queued, with
one flush and one fsync per commit, at most `commit_delay_s` after the first queued row. Each
row gets a sequence number (`seq`); `durable_seq` says how far the file is synced, so the
engine announces an event (and the service commits Kafka offsets) only once its rows are
durable, without the decision thread ever waiting for the disk. `sync()` still blocks until
everything recorded so far is durable.

Compaction: the file keeps every state change of every action; once it holds more than
`compact_factor` rows per known action (and at least `compact_min_rows`), the writer rewrites
it with the latest row of each action, in the order the actions were first decided (temporary
file, fsync, rename, fsync of the directory), so a restart reads the same entries.

Delivery: the service tells the journal which events Kafka acknowledged (`delivered`, after
its producer's flush); the journal appends a small `{"delivered": {action id: sequence}}` row
(group-committed with the decisions, never waited for) and compaction folds the marks into
each action's row. A restarted engine republishes, for every action whose latest event is not
known delivered, its action and its latest result (`undelivered_events`): an action whose
result was journaled but never reached the bus before a crash reaches it after the restart.
Republished events are unchanged (same header sequence), so the store keeps one row of each;
a mark lost in the crash only costs a duplicate on the bus, never a missing event.

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
import threading
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
    # Highest header sequence of this action's events known to be on the bus (0: none).
    delivered: int = 0

    @property
    def state(self) -> int:
        return self.result.state if self.result is not None else self.action.state


def event_sequence(event: apb.ActionEvent) -> tuple[str, int]:
    """(action id, header sequence) of an action event: what a delivery mark names."""
    if event.WhichOneof("event") == "action":
        return event.action.id, event.action.header.sequence
    return event.result.action_id, event.result.header.sequence


def _b64(msg: object) -> str:
    return base64.b64encode(msg.SerializeToString(deterministic=True)).decode()  # type: ignore[attr-defined]


class JournalError(RuntimeError):
    pass


class Journal:
    """JSON lines: {"action": b64 Action, "result": b64 ActionResult|null, "target": key,
    "approval": bool, "delivered": sequence (after compaction)}, and delivery marks
    {"delivered": {action id: sequence}}."""

    def __init__(
        self,
        path: Path | None,
        fsync: bool = True,
        commit_delay_s: float = 0.002,
        compact_factor: int = 4,
        compact_min_rows: int = 10_000,
    ) -> None:
        self.path = path
        self.fsync = fsync
        self.commit_delay_s = commit_delay_s
        self.compact_factor = compact_factor
        self.compact_min_rows = compact_min_rows
        self.entries: dict[str, Entry] = {}
        self.order: list[str] = []
        self._open: dict[str, None] = {}  # ids not yet final, in decision order
        self._fh = None
        # Shared with the writer thread, under _cond.
        self._cond = threading.Condition()
        self._queued: list[str] = []
        self._latest: dict[str, str] = {}  # action id -> its latest row (compaction)
        self._delivered: dict[str, int] = {}  # action id -> delivery mark (compaction)
        self._seq = 0
        self._durable = 0
        self._rows_in_file = 0
        self._error: str | None = None
        self._stop = False
        self._writer: threading.Thread | None = None
        self.commits = 0
        self.compactions = 0
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            for row, item in self._read_rows(path):
                self._rows_in_file += 1
                if isinstance(item, dict):
                    self._delivered.update(self._mark(item))
                    continue
                self._remember(item)
                self._latest[item.action.id] = row
                if item.delivered:
                    self._delivered[item.action.id] = item.delivered
            self._fh = path.open("a", encoding="utf-8")
            self._writer = threading.Thread(target=self._write_loop, name="journal", daemon=True)
            self._writer.start()

    @staticmethod
    def _read(path: Path) -> Iterator[Entry]:
        for _, item in Journal._read_rows(path):
            if isinstance(item, Entry):
                yield item

    @staticmethod
    def _read_rows(path: Path) -> Iterator[tuple[str, Entry | dict[str, int]]]:
        """Each row as an Entry (a state change) or a dict (a delivery mark)."""
        if not path.exists():
            return
        with path.open(encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                try:
                    row = json.loads(line)
                    if "action" not in row and isinstance(row.get("delivered"), dict):
                        yield (
                            line.rstrip("\n"),
                            {str(k): int(v) for k, v in row["delivered"].items()},
                        )
                        continue
                    action = apb.Action.FromString(base64.b64decode(row["action"]))
                    result = (
                        apb.ActionResult.FromString(base64.b64decode(row["result"]))
                        if row.get("result")
                        else None
                    )
                    yield (
                        line.rstrip("\n"),
                        Entry(
                            action,
                            result,
                            row["target"],
                            bool(row.get("approval")),
                            int(row.get("delivered") or 0),
                        ),
                    )
                except (ValueError, KeyError, TypeError, AttributeError) as exc:
                    # A torn last line after a crash: everything before it is intact.
                    log.warning("journal %s line %d unreadable (%s); skipped", path, n, exc)

    def _remember(self, entry: Entry) -> None:
        prev = self.entries.get(entry.action.id)
        if prev is None:
            self.order.append(entry.action.id)
        elif prev.delivered > entry.delivered:
            entry.delivered = prev.delivered
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
        line = json.dumps(row)
        with self._cond:
            self._queued.append(line)
            self._latest[entry.action.id] = line
            self._seq += 1
            self._cond.notify_all()

    def _mark(self, marks: dict[str, int]) -> dict[str, int]:
        """Apply delivery marks to the entries; returns the ones that moved."""
        moved = {}
        for action_id, sequence in marks.items():
            entry = self.entries.get(action_id)
            if entry is not None and sequence > entry.delivered:
                entry.delivered = sequence
                moved[action_id] = sequence
        return moved

    def delivered(self, events: list[apb.ActionEvent]) -> None:
        """Note that these events are on the bus (Kafka acknowledged them). Not waited for:
        the mark rides on the next group commit; lost in a crash, it only makes the restarted
        engine republish these events once more."""
        marks: dict[str, int] = {}
        for ev in events:
            action_id, sequence = event_sequence(ev)
            marks[action_id] = max(sequence, marks.get(action_id, 0))
        moved = self._mark(marks)
        if not moved or self._fh is None:
            return
        with self._cond:
            self._delivered.update(moved)
            self._queued.append(json.dumps({"delivered": moved}))
            self._seq += 1
            self._cond.notify_all()

    def undelivered_events(self) -> list[apb.ActionEvent]:
        """What a restarted engine republishes: for every action whose latest event is not
        known delivered, the action (unless delivered) and its latest result, in decision
        order. Intermediate results are not kept (compaction) and not needed: the latest
        result carries the apply's fields forward."""
        out = []
        for action_id in self.order:
            entry = self.entries[action_id]
            # A node's own action (taken in as a fact) is the node's to announce: only what the
            # engine added to it (its verification, a rollback's outcome) is the engine's.
            node = entry.action.level == apb.ACTION_LEVEL_NODE
            if not node and entry.action.header.sequence > entry.delivered:
                out.append(apb.ActionEvent(action=entry.action))
            r = entry.result
            if r is None or r.header.sequence <= entry.delivered:
                continue
            if not node or r.header.source_id != entry.action.header.source_id:
                out.append(apb.ActionEvent(result=r))
        return out

    @property
    def seq(self) -> int:
        """Rows recorded so far (the sequence number of the last one)."""
        return self._seq

    @property
    def durable_seq(self) -> int:
        """Rows known to be in the file (synced when `fsync`)."""
        return self._durable if self._fh is not None else self._seq

    def wait_durable(self, seq: int, timeout: float | None = None) -> bool:
        """Block until rows up to `seq` are durable; False on timeout. Raises JournalError
        when the writer failed."""
        if self._fh is None:
            return True
        with self._cond:
            ok = self._cond.wait_for(
                lambda: self._durable >= seq or self._error is not None or self._stop, timeout
            )
            if self._error is not None and self._durable < seq:
                raise JournalError(f"journal {self.path}: {self._error}")
            return ok and self._durable >= seq

    def sync(self) -> None:
        """Make everything recorded so far durable (waits for the writer's group commit).

        Called before events are published and offsets committed. An action applied but not
        yet synced when the process dies is decided again under the same id after the restart,
        and the actuator's idempotency key turns the second apply into a replay.
        """
        self.wait_durable(self._seq)

    def _write_loop(self) -> None:
        assert self._fh is not None
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._queued) or self._stop)
                if not self._queued and self._stop:
                    return
                if self.commit_delay_s > 0 and not self._stop:
                    # Gather what the decision thread records next (one fsync for all).
                    self._cond.wait_for(lambda: self._stop, self.commit_delay_s)
                rows, self._queued = self._queued, []
                seq = self._seq
                compact = self._rows_in_file + len(rows) > max(
                    self.compact_min_rows, self.compact_factor * len(self._latest)
                )
                latest = (
                    [(row, self._delivered.get(i, 0)) for i, row in self._latest.items()]
                    if compact
                    else []
                )
            try:
                if compact:
                    self._rewrite(latest)
                    written = len(latest)
                else:
                    self._fh.write("".join(r + "\n" for r in rows))
                    self._fh.flush()
                    if self.fsync:
                        os.fsync(self._fh.fileno())
                    written = self._rows_in_file + len(rows)
            except OSError as exc:
                log.error("journal %s: %s", self.path, exc)
                with self._cond:
                    self._error = str(exc)
                    self._queued[:0] = rows  # written first on the next attempt
                    self._cond.notify_all()
                    if self._stop:
                        return
                    self._cond.wait_for(lambda: self._stop, 0.1)
                continue
            with self._cond:
                self._rows_in_file = written
                self._durable = max(self._durable, seq)
                self._error = None
                self.commits += 1
                self._cond.notify_all()

    @staticmethod
    def _with_mark(row: str, delivered: int) -> str:
        if not delivered:
            return row
        data = json.loads(row)
        data["delivered"] = delivered
        return json.dumps(data)

    def _rewrite(self, rows: list[tuple[str, int]]) -> None:
        """Compaction: the latest row of each action (with its delivery mark), replacing the
        file atomically."""
        assert self.path is not None and self._fh is not None
        tmp = self.path.with_suffix(self.path.suffix + ".compact")
        with tmp.open("w", encoding="utf-8") as fh:
            fh.write("".join(self._with_mark(r, d) + "\n" for r, d in rows))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        self._fh.close()
        self._fh = self.path.open("a", encoding="utf-8")
        self.compactions += 1

    def compact(self) -> None:
        """Rewrite the file now with the latest row of each action (normally automatic)."""
        if self._fh is None:
            return
        with self._cond:
            self._rows_in_file = 1 << 62  # the next commit compacts
            self._queued.append(next(iter(self._latest.values()), ""))
            self._seq += 1
            self._cond.notify_all()
        self.sync()

    def get(self, action_id: str) -> Entry | None:
        return self.entries.get(action_id)

    def open_entries(self) -> list[Entry]:
        return [self.entries[i] for i in self._open]

    def close(self) -> None:
        if self._fh is None:
            return
        self.sync()
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._writer is not None:
            self._writer.join(30)
        self._fh.close()
        self._fh = None
