"""Checks an engine must pass before any of its cells runs: image, command, mounts.

One failed check stops that engine's cells (the workflow makes them depend on it) with
one clear message, while the other engines' cells go on.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from gridbench.engines.runtime import runtime_for
from gridbench.errors import EngineStartError
from gridbench.grid import Grid


def check_engine(grid: Grid, engine: str) -> dict[str, Any]:
    configs = [c for c in grid.selected() if c.engine.name == engine]
    if not configs:
        raise EngineStartError(f"engine {engine}: no selected config uses it")
    first = configs[0]
    if first.engine.runtime == "process":
        program = first.engine.command[0]
        if not shutil.which(program):
            raise EngineStartError(
                f"engine {engine}: command {program!r} is not found on PATH",
                hint=f"install it, activate its environment, or fix engines.{engine}.command",
            )
    image = runtime_for(first.engine.runtime).image_info(first)  # raises ImageNotFoundError
    missing = sorted({v.host for c in configs for v in c.all_volumes if not Path(v.host).exists()})
    if missing:
        users = sorted({c.name for c in configs for v in c.all_volumes if v.host in missing})
        raise EngineStartError(
            f"engine {engine}: volume host paths do not exist: {', '.join(missing)} "
            f"(mounted by {', '.join(users)})",
            hint="put the files there or fix the volumes' host paths in the config",
        )
    return {
        "engine": engine,
        "runtime": first.engine.runtime,
        **image.to_json(),
        "configs": [c.name for c in configs],
    }
