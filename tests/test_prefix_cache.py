"""The prefix-cache pass in the dataset, graph and report: cached-context columns beside the
cold ones, built from the pass's own raw files, and a failed cached cell shown as failed."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pandas as pd
import pytest

import synthetic
from conftest import REPO, load_yaml
from gridbench.aggregate import dataset, plots
from gridbench.aggregate.report import render_report
from gridbench.cells.kinds.benchy import CachedCellPlan
from gridbench.cells.plan import depth_plan
from gridbench.config.grid import Grid
from gridbench.config.loading import load_grid
from gridbench.layout import CellFiles
from gridbench.util import codec
from report_fixtures import read_back

COLD_TTFT_MS = {0: 40.0, 256: 80.0, 512: 120.0, 1024: 200.0}


@pytest.fixture
def grid() -> Grid:
    """config/mechanism.yaml: its D_q8_0_n0 has the pass, its other three configs do not."""
    return load_grid(load_yaml(REPO / "config/mechanism.yaml"), "mechanism.yaml")


def cold_results(plan) -> dict:
    results = {}
    for cell in plan.cells:
        depth = cell.depth
        raw = synthetic.benchy_raw(
            depth,
            decode=(300.0, 3.0),
            prefill=(9000.0, 90.0),
            ttft_ms=(COLD_TTFT_MS[depth], 2.0),
            pp=128,
            tg=64,
        )
        prov = synthetic.provenance_record(plan.configs[cell.config], "cell")
        results[cell.config, depth] = (raw, prov)
    return results


def cached_raw(depth: int, *, ttft_ms: float = 20.0, prefill: tuple[float, float] | None = (6000.0, 60.0)):
    # the context load is the slow one: a row must never take its values
    return synthetic.cached_benchy_raw(
        depth, load_ttft_ms=(999.0, 9.0), ttft_ms=(ttft_ms, 1.0), prefill=prefill, pp=128, tg=64
    )


def cached_results(plan, **changes) -> dict:
    prov = synthetic.provenance_record(plan.configs["D_q8_0_n0"], "cell")
    return {(c.config, c.depth): (cached_raw(c.depth, **changes), prov) for c in plan.cached_cells}


def rows(plan, cached, cached_failures=None) -> pd.DataFrame:
    cold, _ = read_back(cold_results(plan), {})
    frame = dataset.to_frame(
        dataset.rows_from_results(plan, cold, {}, *read_back(cached, cached_failures or {}))
    )
    return frame.set_index(["config", "context_tokens"])


def test_the_plan_has_a_cached_cell_per_depth_with_context_of_the_pass_configs(grid):
    plan = depth_plan(grid)
    assert [(c.config, c.depth) for c in plan.cached_cells] == [
        ("D_q8_0_n0", 256),
        ("D_q8_0_n0", 512),
        ("D_q8_0_n0", 1024),
    ]
    assert plan.cached_cells[0] == CachedCellPlan(
        config="D_q8_0_n0",
        depth=256,
        files=CellFiles(
            raw="results/raw/D_q8_0_n0/depth_256.pc.json",
            provenance="results/raw/D_q8_0_n0/depth_256.pc.provenance.json",
            failure="results/failures/D_q8_0_n0/depth_256.pc.json",
            log="logs/cells/D_q8_0_n0/depth_256.pc.log",
        ),
        expected_requests=2 * grid.benchy.runs * grid.benchy.concurrency,
    )


def test_cached_columns_sit_beside_the_cold_ones_from_the_measured_phase(grid):
    frame = rows(depth_plan(grid), cached_results(depth_plan(grid)))
    row = frame.loc[("D_q8_0_n0", 1024)]
    assert row["status"] == "ok" and row["cached_status"] == "ok"
    assert row["ttft_ms"] == 200.0 and row["ttft_ms_cached"] == 20.0  # not the context load's 999
    assert row["ttft_ms_cached_std"] == 1.0
    assert row["prefill_tps_cached"] == 6000.0 and row["ttft_cached_speedup"] == 10.0
    assert row["cached_raw_path"] == "results/raw/D_q8_0_n0/depth_1024.pc.json"
    # depth 0 has no context to cache, and the other configs have no pass
    assert pd.isna(frame.loc[("D_q8_0_n0", 0), "cached_status"])
    assert frame.loc["D_f16_n0", "cached_status"].isna().all()
    assert frame.loc["D_f16_n0", "ttft_ms_cached"].isna().all()


def test_a_null_metric_is_a_missing_value_never_a_crash(grid):
    plan = depth_plan(grid)
    frame = rows(plan, cached_results(plan, prefill=None))  # llama-benchy left pp_throughput null
    row = frame.loc[("D_q8_0_n0", 512)]
    assert row["cached_status"] == "ok" and row["ttft_ms_cached"] == 20.0
    assert pd.isna(row["prefill_tps_cached"]) and pd.isna(row["prefill_tps_cached_std"])


def test_prefill_is_missing_where_llama_benchy_counts_the_cached_context_as_prefilled(grid):
    plan = depth_plan(grid)
    prov = synthetic.provenance_record(plan.configs["D_q8_0_n0"], "cell")
    cached = cached_results(plan)
    # pp 2048 over a 256-token context: the server's count (2304) passes llama-benchy's 20 % test
    raw = synthetic.cached_benchy_raw(
        256, load_ttft_ms=(50.0, 1.0), ttft_ms=(30.0, 1.0), prefill=(7000.0, 1.0), pp=2048
    )
    cached[("D_q8_0_n0", 256)] = (raw, prov)
    frame = rows(plan, cached)
    assert pd.isna(frame.loc[("D_q8_0_n0", 256), "prefill_tps_cached"])
    assert frame.loc[("D_q8_0_n0", 256), "ttft_ms_cached"] == 30.0
    assert frame.loc[("D_q8_0_n0", 512), "prefill_tps_cached"] == 6000.0  # 512 >= 20 % of 128


def test_a_failed_cached_cell_is_shown_failed_with_its_reason_and_the_cold_cell_stays(grid):
    plan = depth_plan(grid)
    cached = cached_results(plan)
    del cached[("D_q8_0_n0", 512)], cached[("D_q8_0_n0", 1024)]
    cell = next(c for c in plan.cached_cells if c.depth == 512)
    record = codec.to_json(
        synthetic.failure_record(
            cell,
            "cell D_q8_0_n0 depth 512 (cached context)",
            "cell D_q8_0_n0 depth 512 (cached context): boom",
            prefix_cache=True,
        )
    )
    frame = rows(plan, cached, {("D_q8_0_n0", 512): record})
    failed = frame.loc[("D_q8_0_n0", 512)]
    assert failed["cached_status"] == "failed" and failed["cached_reason"].endswith("boom")
    assert failed["cached_failure_path"] == "results/failures/D_q8_0_n0/depth_512.pc.json"
    assert pd.isna(failed["ttft_ms_cached"]) and pd.isna(failed["ttft_cached_speedup"])
    assert failed["status"] == "ok" and failed["ttft_ms"] == 120.0
    never = frame.loc[("D_q8_0_n0", 1024)]  # no result and no record: it never ran
    assert never["cached_status"] == "failed" and never["cached_reason"] == dataset.NOT_RUN


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (
            json.dumps(
                codec.to_json(synthetic.benchy_raw(256, decode=(1, 0), prefill=(1, 0), ttft_ms=(1, 0)))
            ),
            "without --enable",
        ),
        (
            json.dumps(
                codec.to_json(dataclasses.replace(cached_raw(256), benchmarks=cached_raw(256).benchmarks[:1]))
            ),
            "0 llama-benchy results",
        ),
    ],
)
def test_a_cached_file_that_is_not_a_cached_measurement_is_a_failed_cached_cell(
    grid, tmp_path, monkeypatch, content, reason
):
    """A cold result under the cached name, or one holding only the context load."""
    monkeypatch.chdir(tmp_path)
    plan = depth_plan(grid)
    for cell in plan.cells:
        synthetic.write_cell(cell, *cold_results(plan)[cell.config, cell.depth], Path())
    for cell in plan.cached_cells:
        synthetic.write_cell(cell, *cached_results(plan)[cell.config, cell.depth], Path())
    Path("results/raw/D_q8_0_n0/depth_256.pc.json").write_text(content)
    frame = dataset.build_from_plan(
        plan, csv=Path("d.csv"), json_path=Path("d.json"), parquet=Path("d.parquet")
    ).set_index(["config", "context_tokens"])
    row = frame.loc[("D_q8_0_n0", 256)]
    assert row["status"] == "ok" and row["cached_status"] == "failed" and reason in row["cached_reason"]
    assert frame.loc[("D_q8_0_n0", 512), "cached_status"] == "ok"
    assert dataset.foreign_files() == []  # the .pc files are cell files
    assert "NaN" not in Path("d.json").read_text()


def test_the_report_tables_cold_against_cached_and_lists_the_failed_cell(grid):
    plan = depth_plan(grid)
    cached = cached_results(plan)
    del cached[("D_q8_0_n0", 512)]
    frame = rows(plan, cached).reset_index()
    text = render_report(grid, frame, None, [])
    section = text.split("## Prefix cache: TTFT cold vs cached context\n\n")[1].split("\n## ")[0]
    assert "| depth | cold TTFT (ms) | cached TTFT (ms) | speedup |" in section
    assert "| 1024 | 200 ± 2 | 20.0 ± 1.0 | 10.00× |" in section
    assert "| 512 | 120 ± 2 | failed | — |" in section
    assert "| `D_q8_0_n0` | depth 512 (cached context) | failed |" in text
    assert "0 of 16 depth cells and 1 of 3 prefix-cache cells failed" in text


def test_the_graph_draws_both_lines_and_marks_a_failed_cell(grid):
    plan = depth_plan(grid)
    cached = cached_results(plan)
    del cached[("D_q8_0_n0", 512)]
    fig = plots.ttft_cached_vs_context(rows(plan, cached).reset_index())
    (ax,) = fig.axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    cached_y = list(lines["D_q8_0_n0 cached"].get_ydata())
    assert cached_y[0] == 20.0 and math.isnan(cached_y[1]) and cached_y[2] == 20.0  # broken, not bridged
    assert list(lines["D_q8_0_n0 cold"].get_ydata()) == [80.0, 120.0, 200.0]
    assert list(lines["✕ failed cell (no value)"].get_xdata()) == [512]
    assert fig._suptitle.get_text() == "TTFT cold vs cached context by depth"


def test_without_the_pass_the_graph_says_so(grid):
    plan = dataclasses.replace(depth_plan(grid), cached_cells=())
    frame = dataset.to_frame(dataset.rows_from_results(plan, *read_back(cold_results(plan), {})))
    (ax,) = plots.ttft_cached_vs_context(frame).axes
    assert "no config has the prefix-cache pass" in ax.texts[0].get_text()
