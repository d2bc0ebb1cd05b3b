"""The engine events of a working directory (logs/engines/events.jsonl): start, ready,
reuse, stop and reclaim, one JSON object a line, for the progress view and for diagnosis."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gridbench import layout
from gridbench.errors import ResultFileError

# an event's fields are free-form JSON values: slots, ports, seconds, owners
EventValue = str | int | float | bool | list[str] | None


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def log_event(event: str, config: str, **fields: EventValue) -> None:
    path = Path(layout.ENGINE_EVENTS)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"ts": now_iso(), "event": event, "config": config, **fields}
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


@dataclass(frozen=True)
class TimedEvent:
    """One line of the events file with its time, as the GPU time ledger reads it
    (gridbench.aggregate.ledger): which engine did what on which slots, and when."""

    at: datetime
    event: str  # start, ready, reuse, stop, reclaim
    config: str
    slot: str
    slots: tuple[str, ...]  # a start's and a reuse's; the one slot otherwise
    ready_s: float | None = None  # a ready event's


def parse_event(line: str) -> TimedEvent:
    """One line of the file; ResultFileError where it is no event gridbench wrote."""
    try:
        record = json.loads(line)
        slot = str(record.get("slot", ""))
        slots = record.get("slots") or [slot]
        ready_s = record.get("ready_s")
        return TimedEvent(
            at=datetime.fromisoformat(record["ts"]),
            event=str(record["event"]),
            config=str(record["config"]),
            slot=slot,
            slots=tuple(str(s) for s in slots),
            ready_s=float(ready_s) if ready_s is not None else None,
        )
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ResultFileError(f"not an engine event: {line.strip()[:200]!r} ({err})") from err


def read_events(path: Path) -> list[TimedEvent]:
    """The events of one file in their order; none where the file does not exist (no engine
    started in that working directory)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [parse_event(line) for line in text.splitlines() if line.strip()]
