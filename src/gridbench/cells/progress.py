"""Where a sweep stands, for a person watching it: cells done of total with an ETA from the
measured cell times, and for each running cell its engine's state and its load generator's
requests so far.

Pure core: typed records in (what the files of the working directory say, read by the
functions at the bottom), a ``SweepProgress`` snapshot and its one-line rendering out.
Nothing here changes a file: it only reads what cells, engines and load generators write
anyway (results, failure records, provenance, logs/engines/events.jsonl, the scratch
folder of a running cell and the progress file in it).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import cattrs

from gridbench import layout
from gridbench.cells.kinds import PlannedCell, cell_kind
from gridbench.cells.kinds.base import RequestProgress, json_lines
from gridbench.cells.plan import sweep_plan
from gridbench.cells.records import CellProvenance, FailureRecord, current_failure, current_provenance
from gridbench.config.grid import Grid
from gridbench.engines.events import EngineEvent
from gridbench.errors import ResultFileError
from gridbench.util import codec
from gridbench.util.files import read_json

if TYPE_CHECKING:
    from rich.panel import Panel

# tempfile.mkdtemp's random tail of a scratch folder's name
_SCRATCH_TAIL_CHARS = 8
POLL_S = 2.0  # how often a follower looks for a cell started or ended


def planned_cells(grid: Grid) -> list[PlannedCell]:
    """Every cell the grid's plan runs, kind by kind."""
    return sweep_plan(grid).cells


@dataclass(frozen=True)
class CellObservation:
    """What the working directory's files say about one planned cell."""

    cell: PlannedCell
    finished: bool = False  # its result and provenance exist
    duration_s: float | None = None  # finished: its provenance's finished_at - started_at
    failed_at: datetime | None = None  # its failure record's
    running_since: datetime | None = None  # when the cell that has a scratch folder started
    requests: RequestProgress | None = None


@dataclass(frozen=True)
class EngineState:
    state: str  # "starting", "warm", "stopped"
    reused: bool = False
    ready_s: float | None = None  # start-up time of a warm engine that a cell started

    def describe(self) -> str:
        if self.state == "warm":
            if self.reused:
                return "engine warm (reused)"
            quick = self.ready_s is not None and self.ready_s < 10  # a CPU engine's fraction of a second
            return f"engine warm (started in {f'{self.ready_s:.1f} s' if quick else _duration(self.ready_s)})"
        if self.state == "starting":
            return "engine starting"
        return "waiting for an engine slot"


@dataclass(frozen=True)
class RunningCell:
    label: str
    running_s: float
    engine: EngineState
    requests: RequestProgress | None


@dataclass(frozen=True)
class SweepProgress:
    total: int
    done: int
    failed: int
    running: tuple[RunningCell, ...]
    eta_s: float | None  # None: no cell of a kind still to run has finished yet
    eta_is_lower_bound: bool  # some cells still to run have no finished cell of their kind

    @property
    def settled(self) -> bool:
        """Every cell ended (done or failed): nothing left for this sweep to do."""
        return self.done + self.failed == self.total and not self.running

    def milestone(self) -> tuple[Any, ...]:
        """What changes when a cell starts or ends or an engine changes state: a follower
        prints a line then, and otherwise once per interval."""
        return (self.done, self.failed, tuple((c.label, c.engine) for c in self.running))


# --- the core ---------------------------------------------------------------------------------


def engine_states(events: Iterable[EngineEvent]) -> dict[str, EngineState]:
    """Each config's engine, as its latest event leaves it."""
    states: dict[str, EngineState] = {}
    for event in events:
        if event.event == "start":
            states[event.config] = EngineState("starting")
        elif event.event == "ready":
            states[event.config] = EngineState("warm", ready_s=event.ready_s)
        elif event.event == "reuse":
            states[event.config] = EngineState("warm", reused=True)
        elif event.event in ("stop", "reclaim"):
            states[event.config] = EngineState("stopped")
    return states


def sweep_progress(
    observations: Sequence[CellObservation],
    events: Iterable[EngineEvent],
    *,
    now: datetime,
    sweep_started_at: datetime | None = None,
) -> SweepProgress:
    """The snapshot. With ``sweep_started_at``, failure records and scratch folders older than
    the sweep are an earlier run's (a failed cell waiting to be redone, a killed cell's leftover)."""

    # a scratch folder's name gives its cell's start in whole seconds
    since = sweep_started_at.replace(microsecond=0) if sweep_started_at else None

    def this_sweep(moment: datetime | None) -> bool:
        return moment is not None and (since is None or moment >= since)

    engines = engine_states(events)
    finished = [o for o in observations if o.finished]
    running = [o for o in observations if not o.finished and this_sweep(o.running_since)]
    running_cells = {o.cell for o in running}
    failed = [
        o for o in observations if not o.finished and o.cell not in running_cells and this_sweep(o.failed_at)
    ]
    ended = {o.cell for o in finished} | {o.cell for o in failed}
    to_run = [o.cell for o in observations if o.cell not in ended]
    eta_s, lower_bound = _eta(finished, to_run, parallel=max(1, len(running)))
    return SweepProgress(
        total=len(observations),
        done=len(finished),
        failed=len(failed),
        running=tuple(
            RunningCell(
                label=o.cell.label,
                running_s=max(0.0, (now - o.running_since).total_seconds()),
                engine=engines.get(o.cell.config, EngineState("stopped")),
                requests=o.requests,
            )
            for o in running
            if o.running_since is not None
        ),
        eta_s=eta_s,
        eta_is_lower_bound=lower_bound,
    )


def _eta(
    finished: Sequence[CellObservation], to_run: Sequence[PlannedCell], parallel: int
) -> tuple[float | None, bool]:
    """Seconds the cells still to run take: each one the median time of the finished cells
    most like it (same config and depth or concurrency, else same depth or concurrency, else
    same kind), spread over the cells running at once."""
    durations: dict[tuple[Any, ...], list[float]] = {}
    for o in finished:
        if o.duration_s is not None:
            for key in o.cell.timing_keys:
                durations.setdefault(key, []).append(o.duration_s)
    total_s = 0.0
    unknown = 0
    for cell in to_run:
        times = next((durations[key] for key in cell.timing_keys if key in durations), None)
        if times is None:
            unknown += 1
        else:
            total_s += statistics.median(times)
    if to_run and unknown == len(to_run):
        return None, False
    return total_s / parallel, unknown > 0


# --- rendering --------------------------------------------------------------------------------


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 600:  # a long-context cell's minutes: seconds still tell it moves
        minutes, rest_s = divmod(round(seconds), 60)
        return f"{minutes} min {rest_s:02d} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes:02d} min"


def describe_eta(progress: SweepProgress) -> str:
    if progress.done + progress.failed == progress.total:
        return "all cells ended"
    if progress.eta_s is None:
        like = " like those left" if progress.done else ""
        return f"ETA unknown until a cell{like} finishes"
    return f"ETA {'at least ' if progress.eta_is_lower_bound else ''}{_duration(progress.eta_s)}"


def _request_count(requests: RequestProgress) -> str:
    phase = " warm-up" if requests.phase == "warm-up" else ""
    text = f"{requests.load_generator}{phase} {requests.requests_done}/{requests.requests_expected} requests"
    return text + (f" ({requests.requests_failed} failed)" if requests.requests_failed else "")


def describe_requests(requests: RequestProgress) -> str:
    text = _request_count(requests)
    if requests.tok_s is not None:
        text += f", {requests.tok_s:.0f} tok/s ({requests.tok_s_meaning})"
    return text


def describe_cell(cell: RunningCell) -> str:
    parts = [cell.engine.describe()]
    if cell.requests is not None:
        parts.append(describe_requests(cell.requests))
    return f"running {cell.label} ({_duration(cell.running_s)}): {', '.join(parts)}"


def progress_line(progress: SweepProgress) -> str:
    """One line for a plain log: `progress 12/84 cells (14 %), 2 failed, ETA 23 min | running ...`."""
    percent = 100 * progress.done // progress.total if progress.total else 100
    head = f"progress {progress.done}/{progress.total} cells ({percent} %)"
    if progress.failed:
        head += f", {progress.failed} failed"
    return " | ".join([f"{head}, {describe_eta(progress)}", *map(describe_cell, progress.running)])


def progress_panel(progress: SweepProgress) -> Panel:
    """The same, as a rich renderable for a terminal: a bar of cells and a row per running cell."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    head = Table.grid(padding=(0, 1))
    failed = f", [red]{progress.failed} failed[/]" if progress.failed else ""
    head.add_row(
        f"{progress.done}/{progress.total} cells{failed}",
        ProgressBar(total=max(progress.total, 1), completed=progress.done + progress.failed, width=40),
        describe_eta(progress),
    )
    cells = Table(box=None, padding=(0, 2), show_edge=False)
    for column in ("running cell", "for", "engine", "requests", "tok/s"):
        cells.add_column(column)
    for cell in progress.running:
        requests = cell.requests
        cells.add_row(
            cell.label,
            _duration(cell.running_s),
            cell.engine.describe().removeprefix("engine "),
            _request_count(requests) if requests else "",
            f"{requests.tok_s:.0f} ({requests.tok_s_meaning})" if requests and requests.tok_s else "",
        )
    body = [head, cells] if progress.running else [head]
    return Panel(Group(*body), title="gridbench sweep", border_style="dim")


# --- the edges: reading the working directory ------------------------------------------------


def _parse_time(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(text) if text else None
    except ValueError:
        return None


Record = TypeVar("Record")


def _record(cls: type[Record], upgrade: Callable[[object], object], path: Path) -> Record | None:
    """The ``cls`` record in ``path`` (upgraded from an older format); None where there is none
    or it is not one: a view of a sweep never stops on a file it cannot use."""
    document = read_json(path)
    if document is None:
        return None
    try:
        upgraded = upgrade(document)
        return codec.from_json(cls, upgraded) if isinstance(upgraded, dict) else None
    except (ResultFileError, cattrs.BaseValidationError):
        return None


@dataclass
class WorkdirReader:
    """Reads the cells' files under ``root``; a finished cell's duration is read once."""

    cells: Sequence[PlannedCell]
    root: Path = Path()
    _durations: dict[str, float | None] = field(default_factory=dict)

    def observations(self, *, with_requests: bool = True) -> list[CellObservation]:
        scratch = self._scratch_folders()
        observations = []
        for cell in self.cells:
            finished = (self.root / cell.files.raw).exists() and (self.root / cell.files.provenance).exists()
            if finished:
                observations.append(
                    CellObservation(cell, finished=True, duration_s=self._duration_s(cell.files.provenance))
                )
                continue
            failure = _record(FailureRecord, current_failure, self.root / cell.files.failure)
            running = scratch.get(cell.scratch_name)
            observations.append(
                CellObservation(
                    cell,
                    failed_at=_parse_time(failure.failed_at) if failure else None,
                    running_since=running[1] if running else None,
                    requests=self._requests(cell, running[0]) if running and with_requests else None,
                )
            )
        return observations

    def engine_events(self) -> list[EngineEvent]:
        try:
            text = (self.root / layout.ENGINE_EVENTS).read_text()
        except FileNotFoundError:
            return []
        return json_lines(EngineEvent, text)

    def snapshot(
        self, *, sweep_started_at: datetime | None = None, with_requests: bool = True
    ) -> SweepProgress:
        return sweep_progress(
            self.observations(with_requests=with_requests),
            self.engine_events(),
            now=datetime.now(UTC),
            sweep_started_at=sweep_started_at,
        )

    def _scratch_folders(self) -> dict[str, tuple[Path, datetime]]:
        """Running cells' scratch folders and start times, by cell (see layout.SCRATCH_PREFIX)."""
        try:
            entries = list(os.scandir(self.root / layout.SCRATCH))
        except FileNotFoundError:
            return {}
        folders = {}
        for entry in entries:
            name, _, started_s = entry.name[:-_SCRATCH_TAIL_CHARS].removesuffix("-").rpartition("-")
            if name and started_s.isdigit():
                folders[name] = (Path(entry.path), datetime.fromtimestamp(int(started_s), UTC))
        return folders

    def _duration_s(self, provenance: str) -> float | None:
        if provenance not in self._durations:
            record = _record(CellProvenance, current_provenance, self.root / provenance)
            if record is None:
                return None  # not cached: it may be read while being replaced
            started, finished = _parse_time(record.started_at), _parse_time(record.finished_at)
            if started is None or finished is None:
                return None
            self._durations[provenance] = (finished - started).total_seconds()
        return self._durations[provenance]

    def _requests(self, cell: PlannedCell, folder: Path) -> RequestProgress | None:
        kind = cell_kind(cell.kind)
        try:
            text = (folder / kind.progress_file).read_text(errors="replace")
        except FileNotFoundError:
            return None  # the load generator has not started yet
        return kind.requests(text, cell.expected_requests)


class Follower:
    """Says a progress line whenever a cell starts or ends, and once per interval, from a
    daemon thread of the sweep's own Snakemake: its lines go wherever Snakemake's log goes
    (the console, a plain CI or SLURM log, .snakemake/log/), and it ends with the process."""

    def __init__(self, reader: WorkdirReader, say: Callable[[str], None], *, interval_s: float) -> None:
        self.reader = reader
        self.say = say
        self.interval_s = interval_s
        self.started_at = datetime.now(UTC)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gridbench-progress", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop following and say the final line."""
        self._stop.set()
        self._thread.join(timeout=10)
        self._say_line()

    def _say_line(self) -> SweepProgress:
        progress = self.reader.snapshot(sweep_started_at=self.started_at)
        self.say(progress_line(progress))
        return progress

    def _run(self) -> None:
        said: tuple[Any, ...] | None = None
        said_at = 0.0
        while True:
            try:
                quick = self.reader.snapshot(sweep_started_at=self.started_at, with_requests=False)
                # once every cell ended, the aggregation rules run: no news until the final line
                due = not quick.settled and time.monotonic() - said_at >= self.interval_s
                if quick.milestone() != said or due:
                    said = self._say_line().milestone()
                    said_at = time.monotonic()
            except Exception as err:  # a progress display must never end the sweep
                self.say(f"progress: could not read the working directory: {err!r}")
                said_at = time.monotonic()
            if self._stop.wait(min(POLL_S, self.interval_s)):
                return


def sweep_follower(grid: Grid, say: Callable[[str], None]) -> Follower | None:
    """The workflow's follower, or None where the config turns it off (progress: false)."""
    if not grid.document["progress"]:
        return None
    interval_s = float(grid.document["progress_interval_s"])
    return Follower(WorkdirReader(planned_cells(grid)), say, interval_s=interval_s)
