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
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gridbench.engines.allocation import ProcessIdentity
from gridbench.engines.commands import LaunchPlan
from gridbench.engines.compile_cache import CompileCache
from gridbench.engines.runtime import ImageInfo, RuntimeHandle
from gridbench.util import codec
from gridbench.util.files import atomic_write_text, read_json


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


@dataclass(frozen=True)
class SlotState(OwnedEngine):
    """The record of a slot's engine (``slot-<slot>.json``), alive or not."""

    plan: LaunchPlan
    started_at: str
    ready_s: float | None  # None until the engine answered
    version: str | None
    image: ImageInfo
    # its compile cache (engines/compile_cache.py); absent for a kind that keeps none
    compile_cache: CompileCache | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)
    # recorded once its watchdog runs; the key is absent until then
    watchdog: ProcessIdentity | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)


@dataclass(frozen=True)
class SlotHolder:
    """The cell that holds a slot (``holder-<slot>.json``), by its config."""

    config: str
    fingerprint: str
    owner: str


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
        data = read_json(self._state_path(slot))
        # a record that names no slots predates engines on several slots: it is this slot's
        return None if data is None else codec.from_json(SlotState, {"slots": [slot], **data})

    def write_state(self, slot: str, state: SlotState | None) -> None:
        path = self._state_path(slot)
        if state is None:
            path.unlink(missing_ok=True)
        else:
            atomic_write_text(path, json.dumps(codec.to_json(state), indent=2))

    def read_holder(self, slot: str) -> SlotHolder | None:
        data = read_json(self._holder_path(slot))
        return None if data is None else codec.from_json(SlotHolder, data)

    def write_holder(self, slot: str, holder: SlotHolder) -> None:
        atomic_write_text(self._holder_path(slot), json.dumps(codec.to_json(holder)))

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
