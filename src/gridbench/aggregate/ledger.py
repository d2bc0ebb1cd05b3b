"""The GPU time ledger of a study: where the time its engines held the GPUs went.

Each engine's life on its slots (from its start event to its stop) is split into its start-up
(start to ready, or the whole life of a start that never got ready), the cells it served (the
load generator's measured run, and the rest of each cell: warm-up, cache reset, counters), the
time no cell ran on it (idle between cells: Snakemake scheduling the next job, the next
command's start-up) and, for the last engine of a sweep, the time after its last cell until the
sweep stopped it (the datasets, graphs and report are built while it is still up). An engine on
several slots counts once per slot: these are GPU-seconds.

Pure: the events (engines.events.EngineEvent) and the cells' spans (CellSpan) in, a GpuLedger
out; ``read_cell_spans`` is the edge that reads the spans from a sweep's files.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from gridbench import layout
from gridbench.aggregate.records import load_json, typed_document
from gridbench.cells.kinds.base import PlannedCell
from gridbench.cells.plan import sweep_plan
from gridbench.cells.records import CellProvenance, FailureRecord, current_failure, current_provenance
from gridbench.config.grid import Grid
from gridbench.engines.events import EngineEvent, read_events

# a stop followed this soon by a start on the same slot is a swap of engines inside a sweep
# (the manager stops one and starts the next in the same call, milliseconds apart); any other
# stop ends a sweep (its onsuccess/onerror, or the watchdog)
SWAP_GAP_S = 5.0
# a failed cell's record is written just after its engine was stopped
PLACEMENT_SLACK_S = 1.0


@dataclass(frozen=True)
class CellSpan:
    """One cell's time: from its command's start to its result (or failure record)."""

    label: str
    config: str
    started_at: datetime
    finished_at: datetime
    measured_s: float | None  # the load generator's measured run; None for a failed cell


@dataclass(frozen=True)
class EngineLife:
    """One engine from its start to its stop, on its slots."""

    config: str
    slots: tuple[str, ...]
    started_at: datetime
    ready_at: datetime | None = None  # None: it never got ready (a failed start)
    stopped_at: datetime | None = None  # None: no stop recorded (still up when the events end)
    ends_sweep: bool = False  # no engine started on its slot right after its stop

    @property
    def gpus(self) -> int:
        return max(1, len(self.slots))


@dataclass(frozen=True)
class LedgerTotals:
    """GPU-seconds of each part of the engines' held time."""

    engine_start_s: float = 0.0
    failed_start_s: float = 0.0
    measurement_s: float = 0.0
    cell_overhead_s: float = 0.0
    failed_cell_s: float = 0.0
    idle_s: float = 0.0
    sweep_end_s: float = 0.0

    @property
    def held_s(self) -> float:
        return (
            self.engine_start_s
            + self.failed_start_s
            + self.measurement_s
            + self.cell_overhead_s
            + self.failed_cell_s
            + self.idle_s
            + self.sweep_end_s
        )

    def __add__(self, other: LedgerTotals) -> LedgerTotals:
        return LedgerTotals(
            *(getattr(self, f) + getattr(other, f) for f in LedgerTotals.__dataclass_fields__)
        )


@dataclass(frozen=True)
class GpuLedger:
    """Where a study's engine-held GPU time went, and how much of it the ledger could place."""

    totals: LedgerTotals = field(default_factory=LedgerTotals)
    starts: int = 0  # engines that got ready
    failed_starts: int = 0
    cells: int = 0  # measured cells placed on an engine's life
    failed_cells: int = 0
    unplaced_cells: int = 0  # measured cells on no recorded engine life (their events are not here)
    open_engines: int = 0  # engines with no stop recorded: their time ends at their last cell
    unheld_s: float = 0.0  # GPU-seconds between an events file's first start and last stop, no engine up

    @property
    def measured_share(self) -> float | None:
        held = self.totals.held_s
        return self.totals.measurement_s / held if held > 0 else None


def _close(life: EngineLife, at: datetime) -> EngineLife:
    return EngineLife(life.config, life.slots, life.started_at, life.ready_at, at)


def _lives_in_order(events: Sequence[EngineEvent]) -> list[EngineLife]:
    """Each engine's start, ready and stop paired on its slot, in the order of their starts."""
    open_lives: dict[str, EngineLife] = {}
    lives: list[EngineLife] = []
    for event in events:
        current = open_lives.get(event.slot)
        if event.event == "start":
            if current is not None:  # no stop recorded: the slot's next start ended it
                lives.append(_close(current, event.at))
            open_lives[event.slot] = EngineLife(event.config, event.held_slots, event.at)
        elif event.event == "ready" and current is not None and current.config == event.config:
            open_lives[event.slot] = EngineLife(current.config, current.slots, current.started_at, event.at)
        elif event.event in ("stop", "reclaim") and current is not None:
            lives.append(_close(current, event.at))
            del open_lives[event.slot]
    lives.extend(open_lives.values())
    return sorted(lives, key=lambda life: life.started_at)


def engine_lives(events: Sequence[EngineEvent]) -> list[EngineLife]:
    """The engines of one events file (one working directory), each marked whether its stop
    ended its sweep (no start followed on any of its slots within SWAP_GAP_S)."""
    lives = _lives_in_order(events)
    starts = [(e.at, set(e.held_slots)) for e in events if e.event == "start"]
    marked = []
    for life in lives:
        stop = life.stopped_at
        swapped = stop is not None and any(
            0 <= (at - stop).total_seconds() <= SWAP_GAP_S and slots & set(life.slots) for at, slots in starts
        )
        ends = stop is not None and not swapped
        marked.append(
            EngineLife(life.config, life.slots, life.started_at, life.ready_at, life.stopped_at, ends)
        )
    return marked


def place_cells(
    lives: Sequence[EngineLife], cells: Iterable[CellSpan]
) -> tuple[dict[int, list[CellSpan]], int]:
    """The cells each life served (by index), and how many measured cells no life holds. A
    cell's life is its config's engine that was up when the cell ended."""
    placed: dict[int, list[CellSpan]] = {}
    unplaced = 0
    for cell in cells:
        holders = [
            i
            for i, life in enumerate(lives)
            if life.config == cell.config
            and life.started_at <= cell.finished_at
            and (
                life.stopped_at is None
                or (cell.finished_at - life.stopped_at).total_seconds() <= PLACEMENT_SLACK_S
            )
        ]
        if holders:
            placed.setdefault(holders[-1], []).append(cell)
        elif cell.measured_s is not None:
            unplaced += 1
    return placed, unplaced


def _seconds(a: datetime, b: datetime) -> float:
    return max(0.0, (b - a).total_seconds())


def _union_s(spans: Sequence[tuple[datetime, datetime]]) -> float:
    total, reach = 0.0, None
    for start, end in sorted(spans):
        if reach is not None and start < reach:
            start = reach
        if end > start:
            total += _seconds(start, end)
            reach = end
    return total


def life_totals(life: EngineLife, cells: Sequence[CellSpan]) -> LedgerTotals:
    """One engine's held time split (GPU-seconds: seconds × its slots)."""
    last = max([c.finished_at for c in cells], default=life.ready_at or life.started_at)
    end = life.stopped_at or max(last, life.ready_at or life.started_at)
    g = life.gpus
    if life.ready_at is None:
        return LedgerTotals(failed_start_s=g * _seconds(life.started_at, end))
    ready = life.ready_at
    clipped = [(max(c.started_at, ready), min(c.finished_at, end), c) for c in cells]
    clipped = [(a, b, c) for a, b, c in clipped if b > a]
    covered = _union_s([(a, b) for a, b, _ in clipped])
    measured = sum(min(c.measured_s, _seconds(a, b)) for a, b, c in clipped if c.measured_s is not None)
    failed = sum(_seconds(a, b) for a, b, c in clipped if c.measured_s is None)
    last_end = max([b for _, b, _ in clipped], default=ready)
    tail = _seconds(last_end, end) if life.ends_sweep else 0.0
    uncovered = _seconds(ready, end) - covered
    return LedgerTotals(
        engine_start_s=g * _seconds(life.started_at, ready),
        measurement_s=g * measured,
        cell_overhead_s=g * max(0.0, covered - measured - failed),
        failed_cell_s=g * failed,
        idle_s=g * max(0.0, uncovered - tail),
        sweep_end_s=g * tail,
    )


def _unheld_s(lives: Sequence[EngineLife]) -> float:
    """GPU-seconds from the first start to the last stop of one events file with no engine up
    on a slot (runs of a sweep that stopped and started again, a slot waiting for another)."""
    stops = [life.stopped_at for life in lives if life.stopped_at is not None]
    if not lives or not stops:
        return 0.0
    slots = {slot for life in lives for slot in life.slots}
    span = _seconds(min(life.started_at for life in lives), max(stops))
    held = sum(life.gpus * _seconds(life.started_at, life.stopped_at) for life in lives if life.stopped_at)
    return max(0.0, span * len(slots) - held)


def build_ledger(event_files: Sequence[Sequence[EngineEvent]], cells: Sequence[CellSpan]) -> GpuLedger:
    """The ledger of a study whose engines' events are ``event_files`` (one per working
    directory or loan of a machine) and whose cells are ``cells``."""
    lives = [life for events in event_files for life in engine_lives(events)]
    placed, unplaced = place_cells(lives, cells)
    totals = LedgerTotals()
    for i, life in enumerate(lives):
        totals = totals + life_totals(life, placed.get(i, []))
    served = [c for i, life in enumerate(lives) if life.ready_at for c in placed.get(i, [])]
    return GpuLedger(
        totals=totals,
        starts=sum(1 for life in lives if life.ready_at is not None),
        failed_starts=sum(1 for life in lives if life.ready_at is None),
        cells=sum(1 for c in served if c.measured_s is not None),
        failed_cells=sum(1 for c in served if c.measured_s is None),
        unplaced_cells=unplaced,
        open_engines=sum(1 for life in lives if life.stopped_at is None),
        unheld_s=sum(_unheld_s(engine_lives(events)) for events in event_files),
    )


# --- the edge: the cells' spans from their files ------------------------------------------------


def _measured_span(label: str, config: str, path: Path) -> CellSpan | None:
    """A measured cell's span, from its provenance record's clock and its load's wall time."""
    document = load_json(path)
    if document is None:
        return None
    record = typed_document(
        CellProvenance, current_provenance(document), f"{path} is not a provenance record"
    )
    if record.bench is None:
        return None
    start, end = datetime.fromisoformat(record.started_at), datetime.fromisoformat(record.finished_at)
    return CellSpan(label, config, start, end, record.bench.wall_s)


def _failed_span(label: str, config: str, path: Path) -> CellSpan | None:
    """A failed cell's span, from its failure record: no measured wall time."""
    document = load_json(path)
    if document is None:
        return None
    record = typed_document(FailureRecord, current_failure(document), f"{path} is not a failure record")
    start, end = datetime.fromisoformat(record.started_at), datetime.fromisoformat(record.failed_at)
    return CellSpan(label, config, start, end, None)


def read_cell_spans(cells: Iterable[PlannedCell]) -> list[CellSpan]:
    """Each planned cell's span: a measured one's from its provenance record, a failed one's
    from its failure record; a cell with neither (not run) has none."""
    spans = []
    for cell in cells:
        span = _measured_span(cell.label, cell.config, Path(cell.files.provenance))
        span = span or _failed_span(cell.label, cell.config, Path(cell.files.failure))
        if span is not None:
            spans.append(span)
    return spans


def event_files_here() -> list[Path] | None:
    """The events files of the working directory: its own, and those of earlier loans of a
    machine that a study copied back under ``logs/<loan>/`` (layout.EARLIER_ENGINE_EVENTS);
    None where there is none (results copied without their logs: no ledger to draw)."""
    found = [
        p
        for p in (Path(layout.ENGINE_EVENTS), *sorted(Path().glob(layout.EARLIER_ENGINE_EVENTS)))
        if p.exists()
    ]
    return found or None


def read_ledger(grid: Grid, event_paths: Sequence[Path]) -> GpuLedger:
    """The ledger of the grid's planned cells and the engines of ``event_paths`` (a file that
    does not exist holds no events)."""
    return build_ledger([read_events(p) for p in event_paths], read_cell_spans(sweep_plan(grid).cells))
