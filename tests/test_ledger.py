"""The GPU time ledger (gridbench.aggregate.ledger) over the committed H200 studies' own
events and provenance records, checked against sums taken straight from those files, and its
report section."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest

from gridbench.aggregate.ledger import (
    CellSpan,
    build_ledger,
    engine_lives,
    event_files_here,
    read_ledger,
)
from gridbench.aggregate.report import render_report
from gridbench.cli.common import grid_from_json
from gridbench.engines.events import EngineEvent, parse_event, read_events
from gridbench.errors import ResultFileError

REPO = Path(__file__).resolve().parents[1]
STUDIES = REPO / "studies"


def _raw_events(study: Path) -> list[dict[str, object]]:
    paths = [study / "logs/engines/events.jsonl", *sorted(study.glob("logs/*/engines/events.jsonl"))]
    return [json.loads(line) for p in paths for line in p.read_text().splitlines() if line.strip()]


def _ts(record: dict[str, object]) -> datetime:
    return datetime.fromisoformat(str(record["ts"]))


def _held_s(records: list[dict[str, object]]) -> float:
    """Start to stop of every engine, paired by hand from the raw lines (one slot per study)."""
    total, started = 0.0, None
    for r in records:
        if r["event"] == "start":
            started = _ts(r)
        elif r["event"] == "stop" and started is not None:
            total += (_ts(r) - started).total_seconds()
            started = None
    return total


def _wall_s(study: Path) -> float:
    return sum(
        json.loads(p.read_text())["bench"]["wall_s"] for p in study.glob("results/**/*.provenance.json")
    )


def _study_ledger(study: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(study)
    return read_ledger(grid_from_json(Path("grid.json")), event_files_here())


def test_the_vllm_study_ledger_matches_its_files(monkeypatch):
    """studies/h200-vllm over its two loans: 12 starts that got ready (11.7 min, the issue's
    figure), loan 1's 18 failed ones, all 84 cells measured on a recorded engine."""
    study = STUDIES / "h200-vllm"
    ledger = _study_ledger(study, monkeypatch)
    records = _raw_events(study)
    t = ledger.totals
    assert (ledger.starts, ledger.failed_starts, ledger.cells, ledger.unplaced_cells) == (12, 18, 84, 0)
    assert ledger.open_engines == 0
    assert t.held_s == pytest.approx(_held_s(records), abs=0.01)
    # start to ready from the event times, against the engines' own ready_s: the same clock, ms apart
    ready_s = sum(float(r["ready_s"]) for r in records if r["event"] == "ready")
    assert t.engine_start_s == pytest.approx(ready_s, abs=0.1)
    assert t.engine_start_s / 60 == pytest.approx(11.7, abs=0.05)
    assert t.measurement_s == pytest.approx(_wall_s(study), abs=0.01)
    assert ledger.measured_share == pytest.approx(t.measurement_s / t.held_s)
    assert 0.2 < (ledger.measured_share or 0) < 0.35  # the vLLM starts (and failed ones) dominate


def test_the_llamacpp_study_mostly_measured(monkeypatch):
    """studies/h200-llamacpp: one run, llama.cpp starts in seconds, so measurement is most of it;
    every engine but the last was swapped for the next, the last stopped at the sweep's end."""
    study = STUDIES / "h200-llamacpp"
    ledger = _study_ledger(study, monkeypatch)
    t = ledger.totals
    assert (ledger.starts, ledger.failed_starts, ledger.cells) == (9, 0, 54)
    assert t.held_s == pytest.approx(_held_s(_raw_events(study)), abs=0.01)
    assert t.measurement_s == pytest.approx(_wall_s(study), abs=0.01)
    assert (ledger.measured_share or 0) > 0.7
    lives = engine_lives(read_events(study / "logs/engines/events.jsonl"))
    assert [life.ends_sweep for life in lives] == [False] * 8 + [True]
    assert t.sweep_end_s > 0 and ledger.unheld_s == pytest.approx(0.0, abs=0.01)


def test_the_report_says_what_share_measured(monkeypatch):
    study = STUDIES / "h200-vllm"
    ledger = _study_ledger(study, monkeypatch)
    grid = grid_from_json(Path("grid.json"))
    dataset = pd.read_parquet("dataset/dataset.parquet")
    natural = pd.read_parquet("dataset/natural.parquet")
    report = render_report(grid, dataset, natural, ledger=ledger)
    assert (
        "- GPU time: 28 % of the engines' 32.7 GPU-minutes measured cells; 12 engine starts took 36 %"
        in report
    )
    assert "## GPU time\n\nOf the 32.7 GPU-minutes the engines held, **28 % measured cells**" in report
    assert "| engine starts (12) | 11.7 | 36 % | start to ready |" in report
    assert "measurement is 41 % of the held time" in report  # without the failed starts
    assert "- GPU time: each engine's life" in report  # the method
    assert "## GPU time" not in render_report(grid, dataset, natural)  # no events given: no ledger


def _event(
    at: datetime, event: str, config: str, slots: tuple[str, ...] = ("0",), ready_s=None
) -> EngineEvent:
    return EngineEvent(
        ts=at.isoformat(), event=event, config=config, slot=slots[0], slots=slots, ready_s=ready_s
    )


def test_two_gpus_count_twice_and_an_engine_without_a_stop_ends_at_its_last_cell():
    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def s(seconds: float) -> datetime:
        return t0 + timedelta(seconds=seconds)

    events = [
        _event(s(0), "start", "A", ("0", "1")),
        _event(s(10), "ready", "A", ("0", "1"), 10.0),
        _event(s(40), "stop", "A", ("0", "1")),
        _event(s(40), "start", "B"),  # a swap on slot 0
        _event(s(42), "ready", "B", ready_s=2.0),
    ]
    cells = [
        CellSpan("A d0", "A", s(9), s(20), 8.0),  # began before ready: its wait is the start's
        CellSpan("A d1", "A", s(25), s(30), None),  # failed on a ready engine
        CellSpan("B d0", "B", s(43), s(50), 6.0),
        CellSpan("C d0", "C", s(60), s(61), 1.0),  # no engine of C recorded
    ]
    ledger = build_ledger([events], cells)
    t = ledger.totals
    assert t.engine_start_s == pytest.approx(2 * 10 + 2)
    assert t.measurement_s == pytest.approx(2 * 8 + 6)
    assert t.cell_overhead_s == pytest.approx(2 * 2 + 1)
    assert t.failed_cell_s == pytest.approx(2 * 5)
    assert t.idle_s == pytest.approx(2 * (30 - 15) + 1)  # A: 10..40 less its cells; B: 42..43
    assert t.sweep_end_s == 0  # A was swapped, B has no stop
    assert (ledger.open_engines, ledger.unplaced_cells, ledger.failed_cells) == (1, 1, 1)
    assert t.held_s == pytest.approx(2 * 40 + (50 - 40))


def test_an_events_line_gridbench_did_not_write_is_an_error(tmp_path):
    path = tmp_path / "events.jsonl"
    line = (STUDIES / "h200-vllm/logs/engines/events.jsonl").read_text().splitlines()[1]
    assert parse_event(line).ready_s == pytest.approx(1.278)
    path.write_text(line + '\n{"event": "start"}\n')
    with pytest.raises(ResultFileError, match="not an engine event"):
        read_events(path)
    assert read_events(tmp_path / "absent.jsonl") == []
