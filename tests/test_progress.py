"""Where a sweep stands, from crafted working directories: counts, ETA, engine states, the
load generators' requests so far, the plain line, the follower and the command."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import synthetic
from conftest import REPO, load_yaml, write_config
from gridbench import layout
from gridbench.cells import progress
from gridbench.cells.kinds import PlannedCell
from gridbench.cells.kinds.benchy import BENCHY, DepthCellPlan
from gridbench.cells.kinds.natural import NATURAL, NaturalCellPlan
from gridbench.cells.progress import (
    Follower,
    WorkdirReader,
    engine_states,
    planned_cells,
    progress_line,
)
from gridbench.config.grid import Grid
from gridbench.config.loading import load_grid
from gridbench.engines.events import EngineEvent
from gridbench.errors import ConfigError
from gridbench.harness.natural import progress_file
from gridbench.harness.stats import RequestTrace
from gridbench.util import codec

FIXTURES = Path(__file__).with_name("fixtures")
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
SWEEP_START = NOW - timedelta(hours=1)


def demo_config() -> dict:
    """One config of the demo: 4 llama-benchy depths and 4 natural cells."""
    config = load_yaml(REPO / "config/mechanism.yaml")
    config["config"] = "D_f16_n0"
    return load_grid(config, "mechanism.yaml").document


def demo_grid() -> Grid:
    return load_grid(demo_config(), "mechanism.yaml")


def iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds")


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def finish(root: Path, cell: PlannedCell, seconds: float) -> None:
    """A cell's result and its provenance record, measured in ``seconds``."""
    write_json(root / cell.files.raw, {})
    started = SWEEP_START + timedelta(minutes=1)
    cfg = load_grid(load_yaml(REPO / "config/mechanism.yaml"), "mechanism.yaml").configs[cell.config]
    ended = iso(started + timedelta(seconds=seconds))
    record = synthetic.provenance_record(cfg, cell.label, started_at=iso(started), finished_at=ended)
    write_json(root / cell.files.provenance, codec.to_json(record))


def fail(root: Path, cell: PlannedCell, at: datetime) -> None:
    assert isinstance(cell, DepthCellPlan | NaturalCellPlan)
    record = replace(synthetic.failure_record(cell, cell.label, "the engine died"), failed_at=iso(at))
    write_json(root / cell.files.failure, codec.to_json(record))


def start(root: Path, cell: PlannedCell, at: datetime) -> Path:
    """The scratch folder run_cell makes for a cell it starts at ``at``."""
    name = layout.SCRATCH_PREFIX.format(
        config=cell.config, cell_id=cell.cell_id, started_s=int(at.timestamp())
    )
    folder = root / layout.SCRATCH / f"{name}ab_3x9z0"
    folder.mkdir(parents=True)
    return folder


def engine_log(root: Path, *events: tuple[str, str, dict]) -> None:
    """Engine events as engines.events.log_event writes them, on slot 0."""
    path = root / layout.ENGINE_EVENTS
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for event, config, fields in events:
            ts = iso(NOW - timedelta(minutes=5))
            record = EngineEvent(ts=ts, event=event, config=config, slot="0", **fields)
            f.write(json.dumps(codec.to_json(record)) + "\n")


def by_label(cells: list[PlannedCell]) -> dict[str, PlannedCell]:
    return {cell.label: cell for cell in cells}


def snapshot(root: Path, cells, **kwargs) -> progress.SweepProgress:
    reader = WorkdirReader(cells, root=root)
    return progress.sweep_progress(
        reader.observations(),
        reader.engine_events(),
        now=NOW,
        sweep_started_at=kwargs.get("since", SWEEP_START),
    )


def test_the_plan_names_every_cell_with_its_files_and_expected_requests():
    cells = planned_cells(demo_grid())
    assert [c.label for c in cells] == [
        "D_f16_n0 depth 0",
        "D_f16_n0 depth 256",
        "D_f16_n0 depth 512",
        "D_f16_n0 depth 1024",
        "D_f16_n0 code c=1",
        "D_f16_n0 code c=4",
        "D_f16_n0 prose c=1",
        "D_f16_n0 prose c=4",
    ]
    depth_256, code_c4 = cells[1], cells[5]
    assert depth_256.files.raw == "results/raw/D_f16_n0/depth_256.json"
    assert depth_256.expected_requests == 2  # runs 2 x concurrency 1
    assert code_c4.files.failure == "results/failures/natural/D_f16_n0/code_c4.json"
    assert code_c4.expected_requests == 4


def test_the_prefix_cache_pass_adds_a_cell_per_depth_with_context_that_counts_its_context_loads():
    config = demo_config()
    config["benchy"]["prefix_cache_pass"] = ["D_f16_n0"]
    cells = by_label(planned_cells(load_grid(config, "mechanism.yaml")))
    cached = [cell for label, cell in cells.items() if label.endswith("cached")]
    assert [c.label for c in cached] == [f"D_f16_n0 depth {d} cached" for d in (256, 512, 1024)]
    assert [c.expected_requests for c in cached] == [4, 4, 4]  # a context load before each request
    assert cells["D_f16_n0 depth 256"].expected_requests == 2  # the cold cell as before
    assert cached[0].files.raw == "results/raw/D_f16_n0/depth_256.pc.json"
    assert cached[0].files.failure == "results/failures/D_f16_n0/depth_256.pc.json"
    assert cached[0].scratch_name == "D_f16_n0-depth_256.pc"


def test_done_failed_and_running_cells_with_an_eta_from_the_measured_times(tmp_path):
    cells = planned_cells(demo_grid())
    cell = by_label(cells)
    finish(tmp_path, cell["D_f16_n0 depth 0"], 10)
    finish(tmp_path, cell["D_f16_n0 depth 256"], 20)
    fail(tmp_path, cell["D_f16_n0 depth 512"], NOW - timedelta(minutes=2))
    finish(tmp_path, cell["D_f16_n0 code c=1"], 5)
    folder = start(tmp_path, cell["D_f16_n0 depth 1024"], NOW - timedelta(seconds=90))
    (folder / BENCHY.progress_file).write_text((FIXTURES / "early_eos_progress.jsonl").read_text())
    engine_log(
        tmp_path,
        ("start", "D_f16_n0", {}),
        ("ready", "D_f16_n0", {"ready_s": 3.2}),
        ("reuse", "D_f16_n0", {}),
    )

    snap = snapshot(tmp_path, cells)
    assert (snap.total, snap.done, snap.failed) == (8, 3, 1)
    # depth 1024: the median of the llama-benchy cells (15 s); the natural cells: code c=1's 5 s
    assert snap.eta_s == pytest.approx(15 + 5 + 5 + 5) and not snap.eta_is_lower_bound
    (running,) = snap.running
    assert running.label == "D_f16_n0 depth 1024" and running.running_s == pytest.approx(90, abs=1)
    assert running.engine == progress.EngineState("warm", reused=True)
    assert running.requests.requests_done == 1 and running.requests.requests_expected == 2
    assert running.requests.tok_s == pytest.approx(10 / 0.050568317000056595)
    assert progress_line(snap) == (
        "progress 3/8 cells (37 %), 1 failed, ETA 30 s | running D_f16_n0 depth 1024 (1 min 30 s): "
        "engine warm (reused), llama-benchy 1/2 requests, 198 tok/s (decode per request)"
    )


def test_until_a_cell_like_those_left_finished_the_eta_is_unknown(tmp_path):
    cells = planned_cells(demo_grid())
    for cell in cells[:4]:
        finish(tmp_path, cell, 10)
    snap = snapshot(tmp_path, cells)
    assert (
        progress_line(snap) == "progress 4/8 cells (50 %), ETA unknown until a cell like those left finishes"
    )


def test_a_cell_is_timed_by_the_finished_cells_most_like_it(tmp_path):
    cells = planned_cells(demo_grid())
    cell = by_label(cells)
    finish(tmp_path, cell["D_f16_n0 depth 0"], 10)
    finish(tmp_path, cell["D_f16_n0 depth 256"], 100)
    finish(tmp_path, cell["D_f16_n0 depth 512"], 200)
    snap = snapshot(tmp_path, cells)
    # depth 1024 has no measured twin: the median of its kind; no natural cell is timed yet
    assert snap.eta_s == pytest.approx(100) and snap.eta_is_lower_bound
    assert "ETA at least 1 min 40 s" in progress_line(snap)


def test_before_the_first_cell_ends_the_eta_is_unknown(tmp_path):
    snap = snapshot(tmp_path, planned_cells(demo_grid()))
    assert snap.eta_s is None and (snap.done, snap.failed, snap.running) == (0, 0, ())
    assert progress_line(snap) == "progress 0/8 cells (0 %), ETA unknown until a cell finishes"


def test_cells_running_at_once_share_the_remaining_time(tmp_path):
    cells = planned_cells(demo_grid())
    cell = by_label(cells)
    for label in ("D_f16_n0 depth 0", "D_f16_n0 code c=1"):
        finish(tmp_path, cell[label], 60)
    start(tmp_path, cell["D_f16_n0 depth 256"], NOW)
    start(tmp_path, cell["D_f16_n0 code c=4"], NOW)
    snap = snapshot(tmp_path, cells)
    assert len(snap.running) == 2 and snap.eta_s == pytest.approx(6 * 60 / 2)


def test_an_earlier_runs_failures_and_leftover_scratch_folders_are_not_this_sweeps(tmp_path):
    cells = planned_cells(demo_grid())
    cell = by_label(cells)
    fail(tmp_path, cell["D_f16_n0 depth 0"], SWEEP_START - timedelta(days=1))  # redone by this sweep
    start(tmp_path, cell["D_f16_n0 depth 256"], SWEEP_START - timedelta(days=1))  # a killed cell's
    snap = snapshot(tmp_path, cells)
    assert (snap.failed, snap.running) == (0, ())
    by_hand = snapshot(tmp_path, cells, since=None)  # `gridbench progress` knows no sweep start
    assert by_hand.failed == 1 and len(by_hand.running) == 1


def test_a_finished_cell_counts_as_done_whatever_an_earlier_failure_says(tmp_path):
    cells = planned_cells(demo_grid())
    cell = cells[0]
    fail(tmp_path, cell, NOW)
    finish(tmp_path, cell, 10)
    snap = snapshot(tmp_path, cells)
    assert (snap.done, snap.failed) == (1, 0)


def test_every_cell_ended_settles_the_sweep(tmp_path):
    cells = planned_cells(demo_grid())
    for cell in cells[:-1]:
        finish(tmp_path, cell, 10)
    fail(tmp_path, cells[-1], NOW)
    snap = snapshot(tmp_path, cells)
    assert snap.settled
    assert progress_line(snap) == "progress 7/8 cells (87 %), 1 failed, all cells ended"


def test_on_a_terminal_the_same_snapshot_is_a_panel(tmp_path):
    from rich.console import Console

    cells = planned_cells(demo_grid())
    finish(tmp_path, cells[0], 10)
    folder = start(tmp_path, cells[4], NOW - timedelta(seconds=5))
    with progress_file(folder / NATURAL.progress_file, "measured", 4) as finished:
        finished(trace(0))
    engine_log(tmp_path, ("start", "D_f16_n0", {}))
    console = Console(record=True, width=150, color_system=None)
    console.print(progress.progress_panel(snapshot(tmp_path, cells)))
    text = console.export_text()
    assert "1/8 cells" in text and "ETA at least 30 s" in text
    assert re.search(r"D_f16_n0 code c=1 +5 s +starting +natural 1/4 requests", text), text


def event(kind: str, **fields) -> EngineEvent:
    return EngineEvent(event=kind, config="C", slot="0", **fields)


@pytest.mark.parametrize(
    "events,described",
    [
        ([], None),
        ([event("start")], "engine starting"),
        ([event("start"), event("ready", ready_s=42.0)], "engine warm (started in 42 s)"),
        ([event("start"), event("ready", ready_s=42.0), event("reuse")], "engine warm (reused)"),
        ([event("start"), event("ready", ready_s=42.0), event("stop")], "waiting for an engine slot"),
        ([event("ready", ready_s=1.0), event("reclaim")], "waiting for an engine slot"),
        ([event("start"), event("ready", ready_s=0.42)], "engine warm (started in 0.4 s)"),
    ],
)
def test_an_engines_state_is_what_its_latest_event_leaves(events, described):
    state = engine_states(events).get("C")
    assert (state.describe() if state else None) == described


def test_llama_benchy_requests_so_far_with_failures_and_a_half_written_line():
    text = (FIXTURES / "http500_every3rd.progress.jsonl").read_text()
    ends = [json.loads(line) for line in text.splitlines() if '"request_end"' in line]
    requests = BENCHY.requests(text + '{"schema":"llama-benchy-progress.v1","type":"request_e', expected=6)
    assert requests.requests_done == len(ends) and requests.requests_expected == 6
    assert requests.requests_failed == sum(1 for e in ends if e["error"]) > 0
    ok = [e["total_tokens"] / e["decode_seconds"] for e in ends if not e["error"]]
    assert requests.tok_s == pytest.approx(sum(ok) / len(ok))


def test_llama_benchy_before_its_first_request_ends():
    requests = BENCHY.requests((FIXTURES / "early_eos_progress.jsonl").read_text().splitlines()[0], 4)
    assert (requests.requests_done, requests.tok_s) == (0, None)
    assert progress.describe_requests(requests) == "llama-benchy 0/4 requests"


def trace(index: int, status: str = "ok", tokens: int | None = 32) -> RequestTrace:
    return RequestTrace(index=index, status=status, start_ns=0, end_ns=1, output_tokens=tokens)


def test_the_natural_harness_writes_a_line_per_finished_request_that_progress_reads(tmp_path):
    path = tmp_path / NATURAL.progress_file
    with progress_file(path, "warm-up", 1) as finished:
        finished(trace(0))
    assert NATURAL.requests(path.read_text(), 4).phase == "warm-up"
    with progress_file(path, "measured", 4) as finished:
        finished(trace(1))
        finished(trace(2, status="errored", tokens=None))
        time.sleep(0.01)  # a measurable time to divide by
        finished(trace(3, tokens=16))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(line["phase"], line["done"], line["output_tokens"]) for line in lines] == [
        ("warm-up", 1, 32),
        ("measured", 1, 32),
        ("measured", 2, 32),
        ("measured", 3, 48),
    ]
    requests = NATURAL.requests(path.read_text(), 4)
    assert (requests.phase, requests.requests_done, requests.requests_expected) == ("measured", 3, 4)
    assert requests.requests_failed == 1
    assert requests.tok_s == pytest.approx(48 / lines[-1]["elapsed_s"])
    assert progress.describe_requests(requests).startswith("natural 3/4 requests (1 failed), ")


def test_without_a_path_the_harness_writes_nothing(tmp_path):
    with progress_file(None, "measured", 1) as finished:
        finished(trace(0))
    assert list(tmp_path.iterdir()) == []


def test_a_natural_cell_before_its_first_request_ends():
    requests = NATURAL.requests("", 16)
    assert progress.describe_requests(requests) == "natural 0/16 requests"


def test_durations_read_plain_and_long():
    assert [progress._duration(s) for s in (None, 4.4, 90, 1400, 3 * 3600 + 5 * 60)] == [
        "?",
        "4 s",
        "1 min 30 s",
        "23 min",
        "3 h 05 min",
    ]


def test_the_follower_says_a_line_when_a_cell_ends_and_a_final_one_when_stopped(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "POLL_S", 0.05)
    cells = planned_cells(demo_grid())
    lines: list[str] = []
    follower = Follower(WorkdirReader(cells, root=tmp_path), lines.append, interval_s=3600)
    follower.start()
    deadline = time.monotonic() + 5
    while not lines and time.monotonic() < deadline:
        time.sleep(0.01)
    finish(tmp_path, cells[0], 10)
    while len(lines) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    follower.stop()
    assert not follower._thread.is_alive()
    assert lines[0].startswith("progress 0/8 cells (0 %)")
    assert lines[1].startswith("progress 1/8 cells (12 %), ETA")  # at once, not after the hour
    assert lines[2] == lines[1] and len(lines) == 3  # the final line


def test_a_follower_that_cannot_read_says_so_and_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "POLL_S", 0.05)

    class Broken(WorkdirReader):
        def snapshot(self, **kwargs):
            raise PermissionError("results")

    lines: list[str] = []
    follower = Follower(Broken([], root=tmp_path), lines.append, interval_s=3600)
    follower.start()
    time.sleep(0.2)
    assert follower._thread.is_alive()
    follower._stop.set()
    follower._thread.join(5)
    assert lines and lines[0].startswith("progress: could not read the working directory: PermissionError")


def test_the_config_switches_it_off_and_sets_the_interval():
    config = demo_config()
    assert (config["progress"], config["progress_interval_s"]) == (True, 30)
    follower = progress.sweep_follower(
        load_grid({**config, "progress_interval_s": 5}, "mechanism.yaml"), print
    )
    assert follower.interval_s == 5
    assert progress.sweep_follower(load_grid({**config, "progress": False}, "mechanism.yaml"), print) is None
    config["progress"] = "false"  # what snakemake --config progress=false gives
    with pytest.raises(ConfigError, match=r"key progress: .*reads only True and False"):
        load_grid(config, "mechanism.yaml")


def progress_command(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).parent / "gridbench"), "progress", "--configfile", "grid.yaml", *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )


def test_the_command_prints_where_the_sweep_stands_and_follows_it_until_every_cell_ended(tmp_path):
    write_config(tmp_path / "grid.yaml", load_yaml(REPO / "config/mechanism.yaml"))
    cells = planned_cells(demo_grid())
    finish(tmp_path, cells[0], 10)
    once = progress_command(tmp_path, "--config", "config=D_f16_n0")
    assert once.returncode == 0, once.stderr
    # 7 cells still to run; the 3 llama-benchy ones take 10 s each, the natural ones are not timed yet
    assert once.stdout == "progress 1/8 cells (12 %), ETA at least 30 s\n"

    for cell in cells[1:-1]:
        finish(tmp_path, cell, 10)
    fail(tmp_path, cells[-1], NOW)
    # not a terminal: plain lines, and the follow ends by itself once every cell ended
    followed = progress_command(tmp_path, "--config", "config=D_f16_n0", "--follow", "--interval", "0.1")
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout == "progress 7/8 cells (87 %), 1 failed, all cells ended\n"
