"""DIR/fleet.json: what happened to every shard's every attempt, on which box. Append-only: an event is added,
never changed, and a write that would change an earlier event is refused, so the ledger of a lost box survives the
re-run that follows it. Written whole (a new file renamed into place) under a lock, so that a reader never sees a
half-written ledger."""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from ..errors import LabError

LEDGER = "fleet.json"
SCHEMA, VERSION = "b70lab.fleet-ledger", 1
EVENTS = ("started", "finished", "lost", "failed")  # lost: Ray lost the box or the task; failed: the shard's own error


class LedgerError(LabError, RuntimeError):
    """The ledger cannot be read back, or a write would rewrite its past."""


@dataclass(frozen=True)
class Event:
    shard: str
    attempt: int
    event: str
    at: str
    box: str | None = None  # the box's label and digest ("box-a [1a2b3c4d]"); None before the task reported it
    host_class: str | None = None
    node: str | None = None  # Ray's node id of the box
    error: str | None = None  # Ray's error (lost) or the shard's (failed), first line
    # finished: the Ray worker's niceness and OOM score [before, after] it was put back to the box's own
    worker: dict[str, list[int]] | None = None


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class Ledger:
    def __init__(self, folder: Path):
        self.path = Path(folder) / LEDGER
        self._lock = FileLock(str(self.path) + ".lock")
        self.events: list[Event] = self.read()

    def read(self) -> list[Event]:
        if not self.path.exists():
            return []
        try:
            record = json.loads(self.path.read_text())
            if record.get("schema") != SCHEMA or record.get("version") != VERSION:
                raise ValueError(f"not a {SCHEMA} version {VERSION} document")
            return [Event(**e) for e in record["events"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise LedgerError(f"{self.path} cannot be read back ({e}): the fleet's ledger is damaged") from e

    def add(self, shard: str, attempt: int, event: str, **facts: Any) -> Event:
        if event not in EVENTS:
            raise ValueError(f"ledger event {event!r}: one of {EVENTS}")
        entry = Event(shard, attempt, event, now(), **facts)
        with self._lock:
            on_disk = self.read()
            if on_disk != self.events[: len(on_disk)] or len(on_disk) > len(self.events):
                raise LedgerError(f"{self.path} changed under this driver: its events are not this run's; stop here")
            self.events.append(entry)
            document = {"schema": SCHEMA, "version": VERSION, "events": [asdict(e) for e in self.events]}
            temporary = self.path.with_suffix(".json.new")
            temporary.write_text(json.dumps(document, indent=1) + "\n")
            os.replace(temporary, self.path)
        return entry

    def attempts(self, shard: str) -> int:
        """How many attempts of this shard were started (or lost before they reported a box)."""
        return max((e.attempt for e in self.events if e.shard == shard), default=0)

    def finished(self, shard: str) -> Event | None:
        return next((e for e in reversed(self.events) if e.shard == shard and e.event == "finished"), None)

    def lost(self, shard: str) -> list[Event]:
        return [e for e in self.events if e.shard == shard and e.event in ("lost", "failed")]
