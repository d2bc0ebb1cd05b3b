"""The watchdog of one engine: it stops the engine once the sweep that owns it is gone.

An engine runs detached (its own process group, or a container) so that it stays warm
across a sweep's cells; a sweep killed without warning (kill -9, the OOM killer, a batch
system's hard kill) cannot stop it. So every engine gets this small detached process, which
checks every second whether the engine still runs (if not, it exits) and whether the
sweep's process still lives (if not, it stops the engine, frees its slots and logs a
``reclaim`` event in the working directory's logs/engines/events.jsonl).

    python -m gridbench.engines.watchdog '<spec as JSON>'

The spec (see ``spec`` below) is what SlotManager records about the engine.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("gridbench.watchdog")
POLL_S = float(os.environ.get("GRIDBENCH_WATCHDOG_POLL_S", 1.0))


def spec(state: dict[str, Any], slot_dir: Path) -> dict[str, Any]:
    """What the watchdog of the engine in slot ``state`` needs to know."""
    keys = ("owner", "owner_process", "config", "fingerprint", "slots", "handle")
    return {**{k: state[k] for k in keys}, "slot_dir": str(slot_dir)}


def start(state: dict[str, Any], slot_dir: Path, log_path: Path) -> subprocess.Popen:
    """Start the watchdog of an engine, detached, in the current working directory."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "gridbench.engines.watchdog", json.dumps(spec(state, slot_dir))],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C to the sweep's terminal must not end it first
        )


def watch(spec: dict[str, Any], poll_s: float = POLL_S) -> str:
    """Wait until the engine stops (``engine gone``) or its owner does (``owner gone``, the
    engine stopped); transient errors (a busy Docker daemon) are retried."""
    from gridbench.engines.allocation import process_gone
    from gridbench.engines.manager import stop_orphan
    from gridbench.engines.runtime import runtime_for

    handle = spec["handle"]
    runtime = None
    failures = 0
    while True:
        try:
            runtime = runtime or runtime_for(handle["runtime"])
            if not runtime.is_running(handle):
                return "engine gone"
            if process_gone(spec["owner_process"]):
                stop_orphan(spec, Path(spec["slot_dir"]), by="watchdog")
                return "owner gone"
            failures = 0
        except Exception as err:  # a watchdog that gave up at once would leave the orphan
            failures += 1
            log.warning(f"watchdog of {spec['config']}: {type(err).__name__}: {err}")
            if failures >= 30:
                return "given up"
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="gridbench %(asctime)s %(levelname)s %(message)s")
    spec = json.loads((argv or sys.argv[1:])[0])
    outcome = watch(spec)
    if outcome != "engine gone":
        log.info(f"watchdog of {spec['config']}: {outcome}")
    return 0 if outcome != "given up" else 1


if __name__ == "__main__":
    sys.exit(main())
