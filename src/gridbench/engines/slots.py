"""The slot directory: what runs on each slot, who holds it, and its locks.

One host-wide directory (``GRIDBENCH_SLOT_DIR``) holds, per slot:

- ``slot-<slot>.json``: the engine on the slot and who owns it (a SlotState; an engine on
  several slots is recorded in each of them);
- ``holder-<slot>.json``: which cell holds the slot right now (a SlotHolder);
- ``slot-<slot>.lock``: the flock the holding cell keeps while it uses the slot;

and ``select.lock``, held while a cell surveys the slots and picks its own. This module only
reads and writes them; which slots a cell gets is policy.py's, starting and stopping engines
lifecycle.py's. The JSON shapes are those the slot files had when they were plain dicts, so a
sweep that runs while gridbench is upgraded reads its engines back.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from gridbench.engines.allocation import ProcessIdentity
from gridbench.engines.commands import LaunchPlan
from gridbench.engines.runtime import ImageInfo, RuntimeHandle, handle_from_json
from gridbench.files import JsonObject, atomic_write_text


def slot_dir() -> Path:
    return Path(os.environ.get("GRIDBENCH_SLOT_DIR", "/tmp/gridbench-slots"))


@dataclass(frozen=True)
class OwnedEngine:
    """An engine, the slots it runs on and the sweep that owns it: what its watchdog needs."""

    owner: str  # the working directory (and cluster job) of the sweep
    owner_process: ProcessIdentity | None  # the sweep's process: the engine ends with it
    config: str
    fingerprint: str
    slots: tuple[str, ...]
    handle: RuntimeHandle

    def owned_json(self) -> JsonObject:
        return {
            "owner": self.owner,
            "owner_process": self.owner_process,
            "config": self.config,
            "fingerprint": self.fingerprint,
            "slots": list(self.slots),
            "handle": self.handle.to_json(),
        }

    @classmethod
    def owned_from_json(cls, data: JsonObject) -> OwnedEngine:
        return OwnedEngine(
            owner=data["owner"],
            owner_process=data.get("owner_process"),
            config=data["config"],
            fingerprint=data["fingerprint"],
            slots=tuple(data["slots"]),
            handle=handle_from_json(data["handle"]),
        )


@dataclass(frozen=True)
class SlotState(OwnedEngine):
    """The record of a slot's engine (``slot-<slot>.json``), alive or not."""

    plan: LaunchPlan
    started_at: str
    ready_s: float | None  # None until the engine answered
    version: str | None
    image: ImageInfo
    watchdog: ProcessIdentity | None = None  # recorded once its watchdog runs

    def to_json(self) -> JsonObject:
        record = {
            **self.owned_json(),
            "plan": self.plan.to_json(),
            "started_at": self.started_at,
            "ready_s": self.ready_s,
            "version": self.version,
            "image": self.image.to_json(),
        }
        if self.watchdog is not None:
            record["watchdog"] = self.watchdog
        return record

    @classmethod
    def from_json(cls, data: JsonObject, slot: str) -> SlotState:
        """The record read from slot ``slot``'s file (which names no slots if it predates them)."""
        owned = OwnedEngine.owned_from_json({"slots": [slot], **data})
        return cls(
            owner=owned.owner,
            owner_process=owned.owner_process,
            config=owned.config,
            fingerprint=owned.fingerprint,
            slots=owned.slots,
            handle=owned.handle,
            plan=LaunchPlan.from_json(data["plan"]),
            started_at=data["started_at"],
            ready_s=data["ready_s"],
            version=data["version"],
            image=ImageInfo.from_json(data["image"]),
            watchdog=data.get("watchdog"),
        )


@dataclass(frozen=True)
class SlotHolder:
    """The cell that holds a slot (``holder-<slot>.json``), by its config."""

    config: str
    fingerprint: str
    owner: str

    def to_json(self) -> JsonObject:
        return {"config": self.config, "fingerprint": self.fingerprint, "owner": self.owner}

    @classmethod
    def from_json(cls, data: JsonObject) -> SlotHolder:
        return cls(config=data["config"], fingerprint=data["fingerprint"], owner=data["owner"])


class SlotStore:
    """The files and locks of one slot directory."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def _state_path(self, slot: str) -> Path:
        return self.dir / f"slot-{slot}.json"

    def _holder_path(self, slot: str) -> Path:
        return self.dir / f"holder-{slot}.json"

    def recorded_slots(self) -> list[str]:
        """The slots that have an engine record, in name order."""
        return [path.stem.removeprefix("slot-") for path in sorted(self.dir.glob("slot-*.json"))]

    def read_state(self, slot: str) -> SlotState | None:
        data = _read_json(self._state_path(slot))
        return None if data is None else SlotState.from_json(data, slot)

    def write_state(self, slot: str, state: SlotState | None) -> None:
        path = self._state_path(slot)
        if state is None:
            path.unlink(missing_ok=True)
        else:
            atomic_write_text(path, json.dumps(state.to_json(), indent=2))

    def read_holder(self, slot: str) -> SlotHolder | None:
        data = _read_json(self._holder_path(slot))
        return None if data is None else SlotHolder.from_json(data)

    def write_holder(self, slot: str, holder: SlotHolder) -> None:
        atomic_write_text(self._holder_path(slot), json.dumps(holder.to_json()))

    def remove_holder(self, slot: str) -> None:
        self._holder_path(slot).unlink(missing_ok=True)

    @contextlib.contextmanager
    def flock(self, name: str, *, blocking: bool) -> Iterator[bool]:
        """Hold the lock file ``name`` for the block; yields False when ``blocking`` is off and
        another process holds it."""
        with (self.dir / name).open("a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def try_lock(self, slot: str) -> IO[str] | None:
        """The slot's lock, held until the returned file is closed; None if a cell holds it."""
        f = (self.dir / f"slot-{slot}.lock").open("a")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            return None
        return f

    def forget(self, engine: OwnedEngine, *, held: Collection[str] = ()) -> None:
        """Remove the records of ``engine`` (a stopped one) from its slots.

        A slot's record goes only where it still names this engine, and only where no cell
        holds the slot (or the caller does: the slots in ``held``); a cell that holds one
        finds the engine dead and cleans up itself."""
        for member in engine.slots:
            lock = None
            if member not in held:
                lock = self.try_lock(member)
                if lock is None:
                    continue
            try:
                state = self.read_state(member)
                if state and state.handle == engine.handle:
                    self.write_state(member, None)
            finally:
                if lock:
                    lock.close()


def _read_json(path: Path) -> JsonObject | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None
