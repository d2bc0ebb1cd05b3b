"""vLLM's own count of speculative decoding, from its engine logs, beside the counters'.

The cells measure acceptance from the Prometheus counters read around their measured window
(engines/spec_metrics.py). vLLM also logs a ``SpecDecoding metrics:`` line for each logging
interval (``VLLM_LOG_STATS_INTERVAL``, 10 s by default) in which anything was drafted: the
tokens drafted and accepted and the acceptance per draft position, to 3 decimals. The two come
from the same counts in the engine, so they can be checked against each other.

They cannot be matched cell by cell: the intervals are longer than most cells and the stamps
have one-second resolution. So each speculative config's per-position acceptance is pooled on
both sides: the counters' over its measured cells, the log's over every line of the engine runs
(one start each) that served those cells. The lines also count what ran outside the cells'
windows (warm-up requests, llama-benchy's coherence check, failed attempts) and miss the last
interval before each engine stopped, so the two agree to TOLERANCE, not to the lines' rounding.

Pure: an engine log's text in, its runs (EngineRun) out; those and the datasets' rows in, one
SpecLogComparison per config out. ``read_engine_runs`` is the edge that reads the logs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd

from gridbench.aggregate.analysis import measured, rows
from gridbench.aggregate.records import missing

# The largest per-position difference that still counts as agreement. The lines' rounding
# alone allows 0.0005; on the committed real-weight studies (studies/h200-real, h100-real) the
# pooled difference is at most 0.006. Pooling is what makes it small: one engine run that served
# one depth cell differs by 0.19 (llama-benchy's warm-up run was a third of its drafts). The
# random-weight configs of studies/h200-vllm differ by up to 0.23: llama-benchy's coherence check
# drafts outside their windows, sampled, and is almost never accepted.
TOLERANCE = 0.02
RATE_HALF_STEP = 0.0005  # the per-position rates are printed to 3 decimals
LENGTH_HALF_STEP = 0.005  # the mean acceptance length to 2
STAMP_SLACK = timedelta(seconds=1)  # a stamp is its second, truncated

# the line engines/lifecycle.py writes into the engine's log before each start
_START = re.compile(r"^=== gridbench: starting (?P<config>\S+) on slot \S+ at (?P<at>\S+): ")
_STAMP = re.compile(
    r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<month>\d\d)-(?P<day>\d\d) "
    r"(?P<hour>\d\d):(?P<minute>\d\d):(?P<second>\d\d) "
)
_SPEC = re.compile(
    r"SpecDecoding metrics: Mean acceptance length: (?P<length>[\d.]+), .*?"
    r"Accepted: (?P<accepted>\d+) tokens, Drafted: (?P<drafted>\d+) tokens, "
    r"Per-position acceptance rate: (?P<rates>[\d.]+(?:, [\d.]+)*)"
)


@dataclass(frozen=True)
class SpecLine:
    """One ``SpecDecoding metrics:`` line: what one logging interval drafted and accepted."""

    at: datetime
    accepted: int  # tokens
    drafted: int  # tokens
    mean_acceptance_length: float
    per_position: tuple[float, ...]  # accepted at each position ÷ drafts, 3 decimals

    @property
    def drafts(self) -> float:
        """The interval's drafts. The line prints draft tokens, not drafts: a method that always
        drafts k tokens drafted Drafted ÷ k; one that may draft fewer (n-gram, a match near the
        end of the context) drafted as many as Accepted ÷ the acceptance per draft, which the
        rates' sum and the mean acceptance length each give to their rounding."""
        k = len(self.per_position)
        full = self.drafted / k
        if self.accepted == 0:
            return full  # no rate to weigh, and nothing tells the drafts' length
        total = sum(self.per_position)
        low, high = total - k * RATE_HALF_STEP, total + k * RATE_HALF_STEP
        length_low = self.mean_acceptance_length - 1 - LENGTH_HALF_STEP
        length_high = self.mean_acceptance_length - 1 + LENGTH_HALF_STEP
        if max(low, length_low) <= min(high, length_high):  # both hold: the narrower band
            low, high = max(low, length_low), min(high, length_high)
        fewest = self.accepted / high
        most = self.accepted / low if low > 0 else float(self.drafted)
        if self.drafted % k == 0 and fewest <= full <= most:
            return full
        return float(round((max(fewest, full) + min(most, float(self.drafted))) / 2))


@dataclass(frozen=True)
class EngineRun:
    """One start of an engine as its log tells it: its config, when it started, its last
    stamped line, and its SpecDecoding lines in order."""

    config: str
    started_at: datetime
    last_stamp: datetime
    lines: tuple[SpecLine, ...]

    def served(self, finished_at: datetime) -> bool:
        """Whether a cell that finished then could have run on this engine."""
        return self.started_at <= finished_at <= self.last_stamp + STAMP_SLACK


def _stamp(match: re.Match[str], start: datetime) -> datetime:
    """A log stamp's time: vLLM's has no year (the start's, or the next one past new year) and
    is the engine host's local time, UTC on the hosts gridbench runs."""
    month, day, hour, minute, second = (int(match[n]) for n in ("month", "day", "hour", "minute", "second"))
    at = datetime(start.year, month, day, hour, minute, second, tzinfo=UTC)
    return at.replace(year=start.year + 1) if at < start - timedelta(days=1) else at


def _spec_line(match: re.Match[str], at: datetime) -> SpecLine:
    return SpecLine(
        at=at,
        accepted=int(match["accepted"]),
        drafted=int(match["drafted"]),
        mean_acceptance_length=float(match["length"]),
        per_position=tuple(float(rate) for rate in match["rates"].split(", ")),
    )


def parse_engine_log(text: str) -> list[EngineRun]:
    """The runs of one engine log (a config's starts, appended in order); lines before the
    first start line belong to none."""
    runs: list[EngineRun] = []
    for line in text.splitlines():
        start = _START.match(line)
        if start:
            at = datetime.fromisoformat(start["at"])
            runs.append(EngineRun(start["config"], at, at, ()))
            continue
        stamp = _STAMP.search(line)
        if not runs or stamp is None:
            continue
        run = runs[-1]
        at = _stamp(stamp, run.started_at)
        spec = _SPEC.search(line, stamp.end())
        lines = (*run.lines, _spec_line(spec, at)) if spec else run.lines
        runs[-1] = EngineRun(run.config, run.started_at, max(run.last_stamp, at), lines)
    return runs


@dataclass(frozen=True)
class CellCounters:
    """A measured cell's counter deltas, as the datasets hold them."""

    config: str
    finished_at: datetime
    drafts: float
    accepted: tuple[float, ...]  # per position


def cell_counters(frame: pd.DataFrame | None) -> list[CellCounters]:
    """The measured cells of a dataset (depth or natural) that have per-position counters."""
    if frame is None or "acceptance_per_position" not in frame.columns:
        return []
    cells = []
    for row in rows(measured(frame)):
        if missing(row["acceptance_per_position"]) or missing(row["spec_drafts"]) or not row["spec_drafts"]:
            continue
        drafts = float(row["spec_drafts"])
        rates = json.loads(str(row["acceptance_per_position"]))
        finished = datetime.fromisoformat(str(row["finished_at"]))
        cells.append(CellCounters(str(row["config"]), finished, drafts, tuple(r * drafts for r in rates)))
    return cells


@dataclass(frozen=True)
class PositionCounts:
    """Drafts and the tokens accepted at each draft position, summed."""

    drafts: float
    accepted: tuple[float, ...]

    @property
    def rates(self) -> tuple[float, ...]:
        return tuple(a / self.drafts for a in self.accepted)


def _summed(drafts: Iterable[float], accepted: Iterable[tuple[float, ...]]) -> PositionCounts:
    columns = list(accepted)
    width = max((len(c) for c in columns), default=0)
    totals = tuple(sum(c[i] for c in columns if i < len(c)) for i in range(width))
    return PositionCounts(sum(drafts), totals)


@dataclass(frozen=True)
class SpecLogComparison:
    """One speculative config's per-position acceptance from the counters and from the log."""

    config: str
    runs: int  # engine runs that served the compared cells
    lines: int
    cells: int
    counters: PositionCounts
    log: PositionCounts

    @property
    def difference(self) -> float:
        """The largest difference at a position (a position one side lacks counts as 0)."""
        mine, theirs = self.counters.rates, self.log.rates
        width = max(len(mine), len(theirs))
        padded = (mine + (0.0,) * width)[:width], (theirs + (0.0,) * width)[:width]
        return max((abs(a - b) for a, b in zip(*padded, strict=True)), default=0.0)

    @property
    def agrees(self) -> bool:
        return self.difference <= TOLERANCE


def _serving_run(runs: Sequence[EngineRun], cell: CellCounters) -> int | None:
    """The index of the run the cell ran on: its config's latest start before it finished."""
    serving = [i for i, run in enumerate(runs) if run.config == cell.config and run.served(cell.finished_at)]
    return max(serving, key=lambda i: runs[i].started_at) if serving else None


def compare(runs: Sequence[EngineRun], cells: Sequence[CellCounters]) -> list[SpecLogComparison]:
    """Per config (in the cells' order), the counters of its cells that ran on a logged run with
    SpecDecoding lines beside the lines of those runs; a config with none is left out."""
    placed: dict[str, dict[int, list[CellCounters]]] = {}
    for cell in cells:
        i = _serving_run(runs, cell)
        if i is not None and runs[i].lines:
            placed.setdefault(cell.config, {}).setdefault(i, []).append(cell)
    comparisons = []
    for config, by_run in placed.items():
        mine = [cell for group in by_run.values() for cell in group]
        lines = [line for i in sorted(by_run) for line in runs[i].lines]
        counters = _summed((c.drafts for c in mine), (c.accepted for c in mine))
        log = _summed(
            (line.drafts for line in lines),
            (tuple(rate * line.drafts for rate in line.per_position) for line in lines),
        )
        if counters.drafts > 0 and log.drafts > 0:
            comparisons.append(SpecLogComparison(config, len(by_run), len(lines), len(mine), counters, log))
    return comparisons


# --- the edge: the engine logs beside the events files ------------------------------------------


def read_engine_runs(event_paths: Sequence[Path]) -> list[EngineRun]:
    """The engine runs logged beside each engine events file (logs/engines/<config>.log, one
    per config, engines/lifecycle.py); none where a folder holds no logs."""
    logs = sorted({log for events in event_paths for log in events.parent.glob("*.log")})
    return [run for log in logs for run in parse_engine_log(log.read_text(errors="replace"))]
