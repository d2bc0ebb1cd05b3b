"""The engine events of a working directory (logs/engines/events.jsonl): start, ready,
reuse, stop and reclaim, one JSON object a line, for the progress view and for diagnosis."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from gridbench import layout

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
