"""What a sweep's Snakemake does on its host besides building the DAG, in one place.

workflow/rules/common.smk keeps pure helpers over the plans; whatever acts goes through one
Sweep: which process owns the engines its cells start (their watchdogs stop them once it is
gone), Snakemake's lock of the working directory and the sweep noted as its holder, the grid
files the rules read, SIGTERM, and the progress follower. It never imports Snakemake: the
parts of Snakemake's workflow object it touches come in as arguments.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, Protocol

import psutil

from gridbench.cells.progress import Follower, sweep_follower
from gridbench.config.grid import Grid
from gridbench.engines.allocation import ProcessIdentity, claim_sweep, record_lock_holder, release_stale_lock
from gridbench.util.files import atomic_write_text

# named by its content: a changed grid is a new input, an unchanged one reruns nothing
GRID_FILE = ".gridbench/grid-{digest}.json"
# How a run is shown, not what it measures: kept out of the grid files, so that
# `--config progress=False` reruns nothing.
DISPLAY_KEYS = ("progress", "progress_interval_s")
# a run's filters (--config config=…), left out of the engine check's grid file
FILTERS = ("engine", "checkpoint", "speculation", "config")


@dataclass(frozen=True)
class GridFile:
    """A grid file's JSON text; its path follows from it."""

    text: str

    @property
    def path(self) -> str:
        """Relative to the working directory, as the rules name their inputs."""
        return GRID_FILE.format(digest=hashlib.sha256(self.text.encode()).hexdigest()[:16])

    def write(self, workdir: Path = Path()) -> str:
        """Write the file unless it is there (same name, same content); its path."""
        target = workdir / self.path
        if not target.exists():
            atomic_write_text(target, self.text)
        return self.path


def grid_file(grid: Grid) -> GridFile:
    """The effective grid, for the rules that need all of it (key order is the report order)."""
    measured = {k: v for k, v in grid.document.items() if k not in DISPLAY_KEYS}
    return GridFile(json.dumps(measured, default=str))


def engine_check_grid_file(grid: Grid) -> GridFile:
    """The grid as an engine's check reads it: every config on the engine, whatever a run's
    filter selects. A filter then leaves the check, and every cell that depends on it, as it
    was, so a few configs run first and the whole grid later measure each cell once."""
    unfiltered = {k: v for k, v in grid.document.items() if k not in FILTERS + DISPLAY_KEYS}
    return GridFile(json.dumps(unfiltered | dict.fromkeys(FILTERS), default=str))


def interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    """SIGTERM's handler: the signal goes on to the running cells (the cell rules exec their
    command, so these are the cells themselves), then Snakemake stops as on Ctrl-C."""
    for job in psutil.Process().children():
        with contextlib.suppress(psutil.NoSuchProcess):
            job.send_signal(signum)
    raise KeyboardInterrupt


class ExecutionSettings(Protocol):
    keep_going: bool


class Workflow(Protocol):
    """The part of Snakemake's workflow object that keep_going_in_cluster_jobs touches."""

    execute: Callable[..., Any]

    @property
    def execution_settings(self) -> ExecutionSettings: ...


@dataclass
class Sweep:
    """This Snakemake's part in a sweep: the sweep itself (a Snakemake a person or a script
    started) or a group or cluster job inside it (``remote_exec``), which runs unlocked."""

    grid: Grid
    process: ProcessIdentity  # the sweep's Snakemake: its end ends the engines
    remote_exec: bool
    workdir: Path = Path()
    _follower: Follower | None = field(default=None, init=False, repr=False)

    @classmethod
    def claim(cls, grid: Grid, *, remote_exec: bool, environ: MutableMapping[str, str] = os.environ) -> Sweep:
        """This Snakemake (or the one that started it on this host) owns the engines its cells
        start: a watchdog stops each engine once that process is gone, also after a kill -9."""
        return cls(grid, claim_sweep(environ), remote_exec)

    @property
    def is_the_sweep(self) -> bool:
        """Whether this Snakemake is the sweep itself, the one that takes the lock."""
        return self.process["pid"] == os.getpid() and not self.remote_exec

    def release_dead_lock(self) -> str | None:
        """Release the lock a killed sweep left (it would stop this one at "Directory cannot
        be locked"); what to tell the user, or None when there was nothing to release."""
        if not self.is_the_sweep:
            return None
        gone = release_stale_lock(self.workdir)
        if gone is None:
            return None
        return (
            f"gridbench: removed the lock that sweep {gone['pid']} left when it was killed "
            "(it is gone); its unfinished cells run again"
        )

    def write_grid_files(self) -> tuple[str, str]:
        """The grid file and the engine check's, written where missing; their paths."""
        return grid_file(self.grid).write(self.workdir), engine_check_grid_file(self.grid).write(self.workdir)

    def keep_going_in_cluster_jobs(self, workflow: Workflow) -> None:
        """A cluster job runs all cells of one config (a group job), and Snakemake runs a
        group's jobs without --keep-going (snakemake/snakemake#2508): one failed cell would
        leave the config's later cells unrun. In a cluster job, keep going as the profile
        says to on the login node; the settings exist only once the run starts."""
        if not self.remote_exec:
            return
        execute = workflow.execute

        def execute_keeping_going(*args: Any, **kwargs: Any) -> Any:
            workflow.execution_settings.keep_going = True
            return execute(*args, **kwargs)

        workflow.execute = execute_keeping_going

    def start(self, say: Callable[[str], None]) -> None:
        """Snakemake holds the lock and runs (onstart; a dry run never gets here): note this
        sweep as the lock's holder, let SIGTERM interrupt, and say where the sweep stands.

        SIGTERM (`kill`, a batch system, a service manager) then acts as Ctrl-C: the running
        cells are interrupted, record it and leave no result, and onerror stops every engine.
        Snakemake's own handler waits for the running cells instead, which can outlast the
        grace period before SIGKILL and leave engines running on the GPU."""
        record_lock_holder(self.process, self.workdir)
        signal.signal(signal.SIGTERM, interrupt)
        self._follower = sweep_follower(self.grid, say)
        if self._follower:
            self._follower.start()

    def stop(self) -> None:
        """Say the progress follower's final line (its thread would end with Snakemake anyway)."""
        if self._follower:
            self._follower.stop()
            self._follower = None
