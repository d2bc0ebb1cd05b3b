"""A sweep's deadline (GRIDBENCH_DEADLINE, seconds since the epoch): an engine start that
would not be ready before it is not begun. A start cut short by the end of a GPU loan or a
cluster job's time limit holds the GPU for nothing; the cells it was for fail with a clear
reason instead, and the next run of the same command measures them."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from gridbench import layout
from gridbench.engines.events import EngineEvent, read_events
from gridbench.errors import EngineDeadlineError

DEADLINE_VARIABLE = "GRIDBENCH_DEADLINE"


def expected_start_s(events: Sequence[EngineEvent], fingerprint: str) -> tuple[float, str] | None:
    """How long a start of ``fingerprint`` is expected to take, and from what (pure): its own
    last start, else the slowest start in the events; None where no start got ready yet."""
    ready = [(e.fingerprint, e.ready_s) for e in events if e.event == "ready" and e.ready_s is not None]
    own = [seconds for started, seconds in ready if started == fingerprint]
    if own:
        return own[-1], "its last start"
    if ready:
        return max(seconds for _, seconds in ready), "the slowest start so far"
    return None


def refuse_late_start(config: str, fingerprint: str, *, now: float | None = None) -> None:
    """Raise EngineDeadlineError where the deadline is set and comes before ``config``'s engine
    would be ready; return otherwise (no deadline, or no start to judge by)."""
    deadline = os.environ.get(DEADLINE_VARIABLE)
    if not deadline:
        return
    try:
        left = float(deadline) - (time.time() if now is None else now)
    except ValueError as err:
        raise EngineDeadlineError(
            f"{DEADLINE_VARIABLE}={deadline!r} is not a time",
            hint="set it to seconds since the epoch (e.g. $(( $(date +%s) + 600 ))) or unset it",
        ) from err
    expected = expected_start_s(read_events(Path(layout.ENGINE_EVENTS)), fingerprint)
    if expected is not None and left < expected[0]:
        seconds, basis = expected
        raise EngineDeadlineError(
            f"{config}: its engine was not started: {max(left, 0):.0f} s are left before the "
            f"sweep's deadline, and a start takes {seconds:.0f} s ({basis})",
            hint="run the same command again with more time: it measures the cells left",
        )
