"""The watchdog of one engine: it stops the engine once the sweep that owns it is gone.

An engine runs detached (its own process group, or a container) so that it stays warm
across a sweep's cells; a sweep killed without warning (kill -9, the OOM killer, a batch
system's hard kill) cannot stop it. So every engine gets this small detached process, which
checks every second whether the engine still runs (if not, it exits) and whether the
sweep's process still lives (if not, it stops the engine, frees its slots and logs a
``reclaim`` event in the working directory's logs/engines/events.jsonl). A cell that finds
such an engine before its watchdog does stops it the same way (stop_orphan).

    python -m gridbench.engines.watchdog '<spec as JSON>'

The spec (WatchdogSpec below) is the part of the slot's record (slots.OwnedEngine) that
names the engine and its owner, and the slot directory.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from gridbench.engines.allocation import process_gone
from gridbench.engines.events import EngineEvent, log_event
from gridbench.engines.runtime import Runtime, runtime_of
from gridbench.engines.slots import OwnedEngine, SlotStore
from gridbench.util import codec

log = logging.getLogger("gridbench.watchdog")
POLL_S = float(os.environ.get("GRIDBENCH_WATCHDOG_POLL_S", 1.0))
ORPHAN_GRACE_S = 3.0  # an engine whose sweep is gone gets this long to stop before SIGKILL


@dataclass(frozen=True)
class WatchdogSpec:
    """What the watchdog of an engine needs to know: the engine, its owner, its slots' directory.

    On its command line as one JSON object: the engine's OwnedEngine fields and ``slot_dir``."""

    engine: OwnedEngine = field(metadata=codec.INLINE)
    slot_dir: Path


def start(engine: OwnedEngine, slot_dir: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """Start the watchdog of an engine, detached, in the current working directory."""
    spec = WatchdogSpec(engine, slot_dir)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "gridbench.engines.watchdog", json.dumps(codec.to_json(spec))],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C to the sweep's terminal must not end it first
        )


def stop_orphan(engine: OwnedEngine, store: SlotStore, *, by: str, held: Collection[str] = ()) -> None:
    """Stop an engine whose sweep is gone, free its slots and log a ``reclaim`` event.

    A slot's record is removed only where no cell holds the slot (or the caller does: the
    slots in ``held``); a cell that holds one finds the engine dead and cleans up itself."""
    owner_pid = engine.owner_process["pid"] if engine.owner_process else None
    log.warning(
        f"engine {engine.config} on slot {','.join(engine.slots)} outlived the sweep in "
        f"{engine.owner} (its process {owner_pid} is gone): stopping it"
    )
    # nobody waits for its answers any more: a short grace, as a busy engine may ignore SIGTERM
    runtime_of(engine.handle).stop(engine.handle, grace_s=ORPHAN_GRACE_S)
    log_event(
        EngineEvent(
            event="reclaim",
            config=engine.config,
            slot=engine.slots[0],
            slots=tuple(engine.slots),
            fingerprint=engine.fingerprint,
            owner=engine.owner,
            owner_pid=owner_pid,
            by=by,
        )
    )
    store.forget(engine, held=held)


def watch(spec: WatchdogSpec, poll_s: float = POLL_S) -> str:
    """Wait until the engine stops (``engine gone``) or its owner does (``owner gone``, the
    engine stopped); transient errors (a busy Docker daemon) are retried."""
    engine = spec.engine
    runtime: Runtime | None = None
    failures = 0
    while True:
        try:
            runtime = runtime or runtime_of(engine.handle)
            if not runtime.is_running(engine.handle):
                return "engine gone"
            if process_gone(engine.owner_process):
                stop_orphan(engine, SlotStore(spec.slot_dir), by="watchdog")
                return "owner gone"
            failures = 0
        except Exception as err:  # a watchdog that gave up at once would leave the orphan
            failures += 1
            log.warning(f"watchdog of {engine.config}: {type(err).__name__}: {err}")
            if failures >= 30:
                return "given up"
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="gridbench %(asctime)s %(levelname)s %(message)s")
    spec = codec.from_json(WatchdogSpec, json.loads((argv or sys.argv[1:])[0]))
    outcome = watch(spec)
    if outcome != "engine gone":
        log.info(f"watchdog of {spec.engine.config}: {outcome}")
    return 0 if outcome != "given up" else 1


if __name__ == "__main__":
    sys.exit(main())
