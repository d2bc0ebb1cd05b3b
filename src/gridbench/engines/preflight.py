"""Checks an engine must pass before any of its cells runs: image, command, mounts.

One failed check stops that engine's cells (the workflow makes them depend on it) with
one clear message, while the other engines' cells go on.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from gridbench.config.grid import Grid, ServingConfig
from gridbench.engines.kinds import engine_kind
from gridbench.engines.runtime import ImageInfo, runtime_for
from gridbench.errors import EngineStartError
from gridbench.util import codec


@dataclass(frozen=True)
class EngineCheck:
    """An engine that passed its check: what it runs, and the configs that use it. Its file
    (results/preflight/<engine>.json) lists the image's keys among its own."""

    engine: str
    runtime: str
    image: ImageInfo = field(metadata=codec.INLINE)
    configs: tuple[str, ...]


def check_engine(grid: Grid, engine: str) -> EngineCheck:
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
    if not first.engine.gpus:
        _check_a_core_is_left(engine, configs)
    image = runtime_for(first.engine.runtime).image_info(first)  # raises ImageNotFoundError
    missing = sorted({v.host for c in configs for v in c.all_volumes if not Path(v.host).exists()})
    if missing:
        users = sorted({c.name for c in configs for v in c.all_volumes if v.host in missing})
        raise EngineStartError(
            f"engine {engine}: volume host paths do not exist: {', '.join(missing)} "
            f"(mounted by {', '.join(users)})",
            hint="put the files there or fix the volumes' host paths in the config",
        )
    return EngineCheck(
        engine=engine,
        runtime=first.engine.runtime,
        image=image,
        configs=tuple(c.name for c in configs),
    )


def _check_a_core_is_left(engine: str, configs: list[ServingConfig]) -> None:
    """A CPU engine given every core of this host leaves none to llama-benchy or to its own
    HTTP thread: while its compute threads decode, a streamed answer waits unsent and arrives
    in one burst, with no decode time to measure (seen in a demo cell: 64 tokens generated
    over 20-30 ms by the engine's log, read by the client within 0.6 ms)."""
    # the host's cores, not this job's: on SLURM the check runs as a one-CPU job on a node
    cores = os.cpu_count() or 1
    kind = engine_kind(configs[0].engine.kind)
    for cfg in configs:
        threads = kind.cpu_threads(cfg.serve_args)
        if threads is not None and threads >= cores:
            raise EngineStartError(
                f"engine {engine}: config {cfg.name} runs it on the CPU with {threads} threads, and "
                f"this host has {cores} cores: none is left for the benchmark client, whose "
                "answers would then arrive in bursts with no decode time to measure",
                hint=f"give it at most {cores - 1} threads (--threads in its extra_args)"
                if cores > 1
                else "run the sweep on a host with at least 2 cores",
            )
