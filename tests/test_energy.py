"""Energy and cost columns from a cell's GPU telemetry: counter against integrated energy, per
output token, per kWh, at the study's GPU-hour price; a cell without telemetry has empty
columns and a note, never zeros; and the report's section on both."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

import report_fixtures as rf
from conftest import REPO, free_port, load_yaml
from gridbench.aggregate import dataset, natural, quality
from gridbench.aggregate.records import NO_TELEMETRY, EnergyColumns, MeasuredCell
from gridbench.aggregate.report import render_report
from gridbench.aggregate.report.energy import energy_section
from gridbench.cells.context import cell_from_grid
from gridbench.cells.plan import natural_plan
from gridbench.cells.run import run_cell
from gridbench.cells.telemetry import GpuSample, absent, summarize
from gridbench.config.grid import Hardware
from gridbench.config.loading import load_grid
from gridbench.harness.greedy import GreedyOutput
from gridbench.harness.stats import RequestRecord
from test_telemetry import no_nvml

# every column that holds a measured value (not the note, not the count of tokens)
VALUES = [f.name for f in dataclasses.fields(EnergyColumns) if f.name != "telemetry_note"]


def _sample(t_s: float, gpu: str, watts: float) -> GpuSample:
    return GpuSample(t_s, gpu, watts, 80.0, 2048.0, 1800.0, 2600.0, 60.0, 0x4)


def _ramp(gpus: tuple[str, ...] = ("GPU-a",)):
    """100, 200 and 300 W at 0, 1 and 2 s on each GPU: 150 + 250 = 400 J per GPU integrated."""
    return [_sample(float(t), g, w) for t, w in enumerate((100.0, 200.0, 300.0)) for g in gpus]


def test_counter_energy_is_preferred_and_the_integral_kept_beside_it():
    telemetry = summarize(_ramp(), ["GPU-a"], energy_j=410.0, window_s=2.0)
    columns = EnergyColumns.of(telemetry, output_tokens=1000, gpu_hour_usd=2.0)
    assert (columns.energy_j, columns.energy_source, columns.energy_j_integrated) == (410.0, "counter", 400.0)
    assert columns.joules_per_output_token == pytest.approx(0.41)  # 410 J / 1000 tokens
    assert columns.output_tokens_per_kwh == pytest.approx(8_780_490.0)  # 1000 * 3.6e6 / 410, 6 digits
    # 1 GPU x 2 s at $2/h = $0.00111111 for 1000 tokens: $1.11111 per million
    assert columns.usd_per_million_output_tokens == pytest.approx(1.11111)
    assert columns.power_w_mean == pytest.approx(200.0) and columns.gpu_memory_used_gib_peak == 2.0
    assert columns.gpu_util_pct_mean == 80.0 and columns.sm_clock_mhz_mean == 1800.0
    assert columns.temperature_c_max == 60.0 and columns.throttle_reasons == "sw_power_cap"
    assert (columns.telemetry_window_s, columns.telemetry_gpus, columns.output_tokens_measured) == (
        2.0,
        1,
        1000,
    )
    assert columns.telemetry_note is None


def test_without_a_counter_the_integral_is_the_energy_and_says_so():
    telemetry = summarize(_ramp(("GPU-a", "GPU-b")), ["GPU-a", "GPU-b"], energy_j=None, window_s=2.0)
    columns = EnergyColumns.of(telemetry, output_tokens=400, gpu_hour_usd=3.6)
    assert (columns.energy_j, columns.energy_source) == (800.0, "integrated")  # 400 J per GPU
    assert columns.joules_per_output_token == 2.0  # 800 J / 400 tokens
    assert columns.output_tokens_per_kwh == 1_800_000.0  # 3.6e6 J per kWh / 2 J per token
    assert columns.power_w_mean == pytest.approx(400.0)  # summed over the GPUs
    # 2 GPUs x 2 s at $3.6/h = $0.004 for 400 tokens: $10 per million
    assert columns.usd_per_million_output_tokens == pytest.approx(10.0)


def test_without_a_price_there_is_no_cost_and_without_tokens_no_per_token_value():
    telemetry = summarize(_ramp(), ["GPU-a"], energy_j=410.0, window_s=2.0)
    assert EnergyColumns.of(telemetry, 1000, None).usd_per_million_output_tokens is None
    untokened = EnergyColumns.of(telemetry, None, 2.0)
    assert untokened.energy_j == 410.0 and untokened.joules_per_output_token is None
    assert untokened.output_tokens_per_kwh is None and untokened.usd_per_million_output_tokens is None
    assert untokened.telemetry_note == "no output token was counted over the window: no per-token value"


@pytest.mark.parametrize(
    ("telemetry", "note"),
    [
        (None, NO_TELEMETRY),
        (absent("NVML unavailable: Driver Not Loaded"), "NVML unavailable: Driver Not Loaded"),
        (summarize([], ["GPU-a"], None, 1.0), "no sample was taken over the measurement"),
    ],
    ids=["older-record", "no-nvml", "no-sample"],
)
def test_without_telemetry_every_value_is_empty_and_the_note_says_why(telemetry, note):
    columns = EnergyColumns.of(telemetry, output_tokens=1000, gpu_hour_usd=2.0)
    assert all(getattr(columns, name) is None for name in VALUES), columns
    assert columns.telemetry_note == note


def test_the_tokens_counted_are_the_ok_requests_and_every_greedy_output():
    def request(status: str, finish_reason: str | None, tokens: int | None) -> RequestRecord:
        return RequestRecord(0, status, None, 0.0, 1.0, output_tokens=tokens, finish_reason=finish_reason)

    requests = [
        request("ok", "length", 16),
        request("errored", None, 5),  # failed: its tokens measured nothing
        request("ok", "stop", 9),
    ]
    assert natural.ok_output_tokens(requests) == 25
    assert natural.ok_output_tokens([request("errored", None, None)]) is None
    counted = GreedyOutput("code", "p", "t", (1, 2, 3), "stop", 4)  # the usage block's count first
    by_ids = GreedyOutput("prose", "p", "t", (1, 2, 3), "stop", None)
    uncounted = GreedyOutput("math", "p", "t", None, "stop", None)
    assert quality.output_tokens([counted, by_ids]) == 7
    assert quality.output_tokens([counted, uncounted]) is None  # a partial count would overstate J/token


def _with_telemetry(cells: dict, telemetry) -> dict:
    return {
        key: MeasuredCell(cell.output, replace(cell.provenance, telemetry=telemetry))
        for key, cell in cells.items()
    }


def test_the_report_states_energy_beside_throughput_and_the_method_once():
    grid, plan, results, failures = rf.seed002()
    measured, failed = rf.read_back(results, failures)
    sampled = _with_telemetry(measured, summarize(_ramp(), ["GPU-a"], energy_j=410.0, window_s=2.0))
    # one cell keeps its synthetic no-NVML record: listed apart, with its reason
    first, second = list(measured)[:2]
    sampled[first] = measured[first]
    grid = replace(grid, study=replace(grid.study, hardware=Hardware(gpu_hour_usd=2.0)))
    frame = dataset.to_frame(dataset.rows_from_results(replace(plan, gpu_hour_usd=2.0), sampled, failed))
    report = render_report(grid, frame)
    method = report.split("## Method\n\n", 1)[1].split("\n## ", 1)[0]
    assert method.count("- Energy:") == 1
    # 400 J integrated against 410 J counted, in every sampled cell
    assert (
        f"over the {len(sampled) - 1} cells with both, the integral ÷ the counter is 0.976 (median" in method
    )
    assert "$2 per GPU-hour (`study.hardware.gpu_hour_usd`, the study's own assumption" in method
    section = report.split("## Energy and cost\n\n", 1)[1].split("\n## ", 1)[0]
    (line,) = [line for line in section.splitlines() if f"| `{second[0]}` | depth {second[1]} |" in line]
    row = frame[(frame["config"] == second[0]) & (frame["context_tokens"] == second[1])].iloc[0]
    # a depth cell's tokens: each measured request (runs x concurrency) generated gen_tokens
    tokens = int(row["runs"]) * int(row["concurrency"]) * int(row["gen_tokens"])
    assert row["output_tokens_measured"] == tokens
    per_token, usd = 410 / tokens, 2.0 * 2.0 / 3600 / tokens * 1e6  # 1 GPU x 2 s at $2/h
    assert f"| 200 | 410 (counter) | {per_token:.3f} |" in line  # mean power, energy, J per token
    assert line.endswith(f"| {usd:.3f} |")  # $ per million output tokens
    assert f"| `{first[0]}` | depth {first[1]} |" not in section
    assert "Measured cells without energy, left out of the table:" in section
    assert "- 1 cell: NVML unavailable: a synthetic record read no GPU" in section


def test_a_study_without_telemetry_says_so_with_the_reason():
    grid, plan, results, failures = rf.seed002()
    frame = rf.depth_frame(plan, results, failures)
    section = energy_section(frame.astype(object), None, grid.study)
    assert section.startswith("No GPU telemetry was recorded for any measured cell")
    assert "cells: NVML unavailable: a synthetic record read no GPU" in section
    assert frame["energy_j"].isna().all() and frame["joules_per_output_token"].isna().all()


# --- a real CPU cell ---------------------------------------------------------------------


@no_nvml
@pytest.mark.integration
def test_a_cpu_cell_has_empty_energy_columns_with_the_nvml_note_and_the_report_says_so(workdir):
    config = load_yaml(REPO / "config/mechanism.yaml")
    config["engines"]["llamacpp"]["port"] = free_port()
    config["natural"] = {
        "prompt_classes": ["code"],
        "concurrency": [1],
        "requests": 2,
        "max_tokens": 8,
        "warmup": 1,
    }
    config.setdefault("study", {})["hardware"] = {"gpu_hour_usd": 2.0}
    grid = load_grid(config, "mechanism.yaml")
    cell = cell_from_grid(grid, "natural", "D_f16_n0", ["cpu"], prompt_class="code", concurrency=1)
    out = Path("results/natural/D_f16_n0/code_c1.json")
    assert run_cell(cell, {"raw": out, "provenance": out.with_suffix(".provenance.json")}) == 0

    plan = natural_plan(grid)
    plan = replace(plan, cells=tuple(c for c in plan.cells if c.key == ("D_f16_n0", "code", 1)))
    frame = natural.to_frame(natural.rows_from_results(plan, *natural.read_natural_cells(plan)))
    (row,) = frame.astype(object).where(frame.notna(), None).to_dict("records")
    assert row["status"] == "ok" and row["output_tok_s"] is not None
    assert all(row[name] is None for name in VALUES), {name: row[name] for name in VALUES}
    assert str(row["telemetry_note"]).startswith("NVML unavailable: ")
    section = energy_section(dataset.to_frame([]).astype(object), frame.astype(object), grid.study)
    assert section.startswith("No GPU telemetry was recorded for any measured cell")
    assert f"- 1 cell: {row['telemetry_note']}" in section


# --- the committed studies, measured before the sampler ------------------------------------


# the studies measured before gridbench sampled GPUs; studies/h100-real was measured with it
BEFORE_THE_SAMPLER = ("h200-llamacpp", "h200-vllm", "h200-real")


def test_every_committed_study_is_checked_for_its_energy_columns():
    assert {p.parent.name for p in (REPO / "studies").glob("*/grid.json")} == {
        *BEFORE_THE_SAMPLER,
        "h100-real",
        "h100-sustained-load",
        "h100-speculation",
        "h200-speculation",
    }


def test_the_sustained_load_study_has_the_gpus_energy_for_every_measured_cell():
    """studies/h100-sustained-load, measured with the sampler: its depth, natural and load
    cells each hold the energy counter's joules and the joules per output token."""
    for name in ("dataset.csv", "natural.csv", "load.csv"):
        ok = pd.read_csv(REPO / "studies/h100-sustained-load/dataset" / name).query("status == 'ok'")
        assert len(ok) >= 1 and ok["telemetry_note"].isna().all(), name
        assert (ok["energy_source"] == "counter").all() and (ok["energy_j"] > 0).all(), name
        assert (ok["joules_per_output_token"] > 0).all(), name


@pytest.mark.parametrize(
    "study", [REPO / "studies" / name for name in BEFORE_THE_SAMPLER], ids=lambda p: p.name
)
def test_a_committed_study_has_empty_energy_columns_that_say_why(study):
    """Their datasets are what finalize builds today (tests/test_fixed_raw_sets.py): the cells
    predate the sampler, so every measured row says so, and holds no energy value."""
    for name in ("dataset.csv", "natural.csv"):
        frame = pd.read_csv(study / "dataset" / name)
        ok = frame[frame["status"] == "ok"]
        assert not ok.empty and (ok["telemetry_note"] == NO_TELEMETRY).all()
        assert ok[[c for c in VALUES if c in ok.columns]].isna().all().all()


@pytest.mark.parametrize(
    ("study_name", "gpu", "steady_cells"),
    [
        ("h100-real", "NVIDIA H100 80GB HBM3", 8),
        ("h200-speculation", "NVIDIA H200", 6),
        ("h100-speculation", "NVIDIA H100 80GB HBM3", 10),
    ],
)
def test_a_gpu_study_has_the_gpus_energy_for_every_measured_cell(study_name, gpu, steady_cells):
    """studies/h100-real, h100-speculation (H100s) and h200-speculation (an H200), measured
    with the sampler: every measured cell has the energy counter's joules; on a steady cell (3 s or
    more) the sampled power's integral agrees with it within a few percent, and over the study
    within 5 % at the median; and its joules per output token and tokens per kWh are one
    another's inverse. A burst of about 1 s (a natural level at c = 16) integrates to 0.83-1.03
    of the counter: NVML's power reading is likely an average over its own last interval, which
    trails a burst's ramp."""
    study = REPO / "studies" / study_name
    for name in ("dataset.csv", "natural.csv"):
        ok = pd.read_csv(study / "dataset" / name).query("status == 'ok'")
        assert len(ok) >= 8 and ok["telemetry_note"].isna().all()
        assert (ok["energy_source"] == "counter").all() and (ok["gpu"] == gpu).all()
        ratio = ok["energy_j_integrated"] / ok["energy_j"]
        steady = ratio[ok["telemetry_window_s"] >= 3]
        assert len(steady) >= steady_cells and steady.between(0.9, 1.1).all(), steady
        assert ratio.median() == pytest.approx(1, abs=0.05) and ratio.between(0.8, 1.1).all(), ratio
        kwh = ok["joules_per_output_token"] * ok["output_tokens_per_kwh"]
        assert kwh.to_numpy() == pytest.approx(3.6e6, rel=1e-3)
