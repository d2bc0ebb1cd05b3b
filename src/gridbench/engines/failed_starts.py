"""A start that failed in a sweep is not tried again by that sweep. An engine that exits during
start-up, or logs a fatal line, does so for every cell of its config (a flag it refuses, a
setting it rejects, a model it cannot load), and each retry holds the GPU for another start-up:
on an H100, nine cells of one config spent 230 s restarting an engine that vLLM's config check
refused each time (studies/h100-speculation, loan 9). The sweep's later cells of that engine
fail at once, naming the first failure; the next sweep (the same command, once fixed) tries
again. A cell run by hand, outside a sweep, always tries. A start that timed out is tried
again: the compile cache it filled can make the next start ready in time."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from gridbench import layout
from gridbench.engines.allocation import SWEEP_VARIABLE
from gridbench.engines.events import EngineEvent, log_event, read_events
from gridbench.errors import EngineStartError

EVENT = "start_failed"


def current_sweep(environ: Mapping[str, str] = os.environ) -> str | None:
    """The sweep this process's cells belong to (allocation.claim_sweep), None outside one."""
    return environ.get(SWEEP_VARIABLE) or None


def earlier_failure(events: Sequence[EngineEvent], fingerprint: str, sweep: str) -> EngineEvent | None:
    """The first failed start of ``fingerprint`` in ``sweep`` (pure), None where it had none."""
    return next(
        (e for e in events if e.event == EVENT and e.fingerprint == fingerprint and e.sweep == sweep), None
    )


def note_failed_start(config: str, slot: str, fingerprint: str, error: EngineStartError) -> None:
    """Record a start that failed, for the sweep's later cells of the same engine."""
    sweep = current_sweep()
    if sweep:
        log_event(
            EngineEvent(
                event=EVENT,
                config=config,
                slot=slot,
                fingerprint=fingerprint,
                sweep=sweep,
                reason=error.message,
            )
        )


def refuse_failed_start(config: str, fingerprint: str, engine_log: Path) -> None:
    """Raise EngineStartError where this sweep already saw ``fingerprint``'s engine fail to
    start; return otherwise."""
    sweep = current_sweep()
    if not sweep:
        return
    failure = earlier_failure(read_events(Path(layout.ENGINE_EVENTS)), fingerprint, sweep)
    if failure is not None:
        raise EngineStartError(
            f"{config}: its engine was not started again: its start failed earlier in this sweep, "
            f"at {failure.ts} ({failure.reason})",
            hint=f"read {engine_log} for why, fix the config or the engine, and run the same command "
            "again: a new sweep tries the start again",
        )
