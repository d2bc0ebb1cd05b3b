"""The engine events of a working directory (logs/engines/events.jsonl): start, ready,
reuse, stop, reclaim and start_failed, one JSON object a line, for the progress view and for diagnosis."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import cattrs

from gridbench import layout
from gridbench.errors import ResultFileError
from gridbench.util import codec


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


OMITTED = codec.OMITTED_WHEN_DEFAULT


@dataclass(frozen=True, kw_only=True)
class EngineEvent:
    """One line of the events file: what ``log_event`` writes, and what the GPU time ledger
    (gridbench.aggregate.ledger) and the progress view read back. A line leaves out the keys
    its event does not have."""

    ts: str = field(default_factory=now_iso)
    event: str  # start, ready, reuse, stop, reclaim, start_failed
    config: str
    slot: str  # where the event happened: the first of the engine's slots
    # a start's, a reuse's and a reclaim's: all the engine's slots (absent in older lines)
    slots: tuple[str, ...] | None = field(default=None, metadata=OMITTED)
    fingerprint: str | None = field(default=None, metadata=OMITTED)
    port: int | None = field(default=None, metadata=OMITTED)  # a start's
    owner: str | None = field(default=None, metadata=OMITTED)  # the sweep that owns the engine
    owner_pid: int | None = field(default=None, metadata=OMITTED)  # a reclaim's
    by: str | None = field(default=None, metadata=OMITTED)  # a reclaim's: who reclaimed it
    ready_s: float | None = field(default=None, metadata=OMITTED)  # a ready event's
    # an engine kind that keeps a compile cache (engines/compile_cache.py): a start's names its
    # folder's key, a ready event what the start made of it (hit, miss, unknown); each counts
    # the compiled files in the folder then
    compile_cache_key: str | None = field(default=None, metadata=OMITTED)
    compile_cache: str | None = field(default=None, metadata=OMITTED)
    compile_cache_files: int | None = field(default=None, metadata=OMITTED)
    # a start's: its cell asked for an engine that has served nothing, and a warm one of the
    # same config, if any, was stopped for it (Cell.needs_fresh_engine)
    fresh: bool = field(default=False, metadata=OMITTED)
    # a start_failed event's (engines/failed_starts.py): the sweep whose cell saw the start
    # fail, and the failure's message
    sweep: str | None = field(default=None, metadata=OMITTED)
    reason: str | None = field(default=None, metadata=OMITTED)

    @property
    def at(self) -> datetime:
        return datetime.fromisoformat(self.ts)

    @property
    def held_slots(self) -> tuple[str, ...]:
        """The engine's slots, where the line names them; its one slot otherwise."""
        return self.slots or (self.slot,)


def log_event(record: EngineEvent) -> None:
    path = Path(layout.ENGINE_EVENTS)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(codec.to_json(record)) + "\n")


def parse_event(line: str) -> EngineEvent:
    """One line of the file; ResultFileError where it is no event gridbench wrote."""
    try:
        return codec.from_json(EngineEvent, json.loads(line))
    except (ValueError, TypeError, AttributeError, cattrs.BaseValidationError) as err:
        raise ResultFileError(f"not an engine event: {line.strip()[:200]!r} ({err})") from err


def read_events(path: Path) -> list[EngineEvent]:
    """The events of one file in their order; none where the file does not exist (no engine
    started in that working directory)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [parse_event(line) for line in text.splitlines() if line.strip()]
