"""The aggregation end of the workflow: dataset, natural dataset, graphs and comparison.md
as Snakemake rules, and `snakemake --report` over them; on cell files written ahead (no
engine needed) and after a real cell on the CPU engine."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pandas as pd
import pytest

import synthetic
from browser import CHROMIUM, Chromium
from conftest import REPO, write_config
from gridbench import layout
from gridbench.cells.context import cell_from_grid
from gridbench.cells.plan import depth_plan, natural_plan
from gridbench.cells.run import _write_failure
from gridbench.config.loading import load_grid_files
from gridbench.errors import BenchmarkError
from gridbench.util import codec
from test_workflow import jobs_of_last_run, snakemake

pytestmark = pytest.mark.workflow

AGGREGATION_RULES = {"build_dataset", "plot_depth_graphs", "render_report", "render_explorer"}
NATURAL_RULES = {"build_natural_dataset", "plot_natural_graphs"}


def ran(workdir: Path, rule: str) -> bool:
    log = sorted((workdir / ".snakemake/log").glob("*.snakemake.log"))[-1].read_text()
    return f"rule {rule}:" in log or f"localrule {rule}:" in log


def build_report(workdir: Path, configfile: str) -> str:
    result = snakemake(workdir, "--configfile", configfile, "--report", "report.html")
    assert result.returncode == 0, result.stdout + result.stderr
    return (workdir / "report.html").read_text()


def write_demo_cells(workdir: Path, config_path: Path) -> None:
    """Every cell of the grid as the files a finished sweep leaves."""
    grid = load_grid_files([config_path])
    plan, nplan = depth_plan(grid), natural_plan(grid)
    for cell in plan.cells:
        cfg = plan.configs[cell.config]
        speculates = cfg.speculation.enabled
        decode = 40.0 + (30.0 if speculates else 0.0) - cell.depth / 64
        raw = synthetic.benchy_raw(
            cell.depth,
            decode=(decode, 2.0),
            prefill=(700.0, 20.0),
            ttft_ms=(200.0 + cell.depth / 3, 8.0),
            pp=128,
            tg=64,
        )
        spec = synthetic.spec_decode(30, [1.0, 0.95, 0.9, 0.9]) if speculates else None
        prov = synthetic.provenance_record(cfg, f"cell {cell.config} depth {cell.depth}", spec=spec)
        synthetic.write_cell(cell, raw, prov, workdir)
    for cell in nplan.cells:
        cfg = nplan.configs[cell.config]
        raw = synthetic.natural_raw(
            cell.config,
            cell.prompt_class,
            cell.concurrency,
            output_tok_s=30.0 * cell.concurrency,
            ttft_ms=(300.0 * cell.concurrency, 350.0 * cell.concurrency),
            tpot_ms=(20.0, 25.0),
            output_tokens=64,
            wall_s=10.0,
        )
        prov = synthetic.provenance_record(
            cfg, "natural", load_generator="gridbench-natural", load_generator_version="0.1.0"
        )
        synthetic.write_cell(cell, raw, prov, workdir)


def test_aggregation_rules_and_snakemake_report_on_written_cells(workdir, demo_config):
    demo_config["study"]["hardware"] = {"name": "2 CPU cores", "memory_bandwidth_gb_s": 20}
    demo_config["study"]["capacity"] = {"ttft_ms_p50": 700, "tpot_ms_p50": 30}
    demo_config["natural"] = {"prompt_classes": ["code", "prose"], "concurrency": [1, 4], "requests": 4}
    config_path = write_config(workdir / "grid.yaml", demo_config)
    write_demo_cells(workdir, config_path)

    result = snakemake(workdir, "--configfile", "grid.yaml", "--rerun-triggers", "mtime")
    assert result.returncode == 0, result.stdout + result.stderr
    assert jobs_of_last_run(workdir, "bench_cell") == []  # every cell was there already
    for rule in AGGREGATION_RULES | NATURAL_RULES:
        assert ran(workdir, rule), rule
    for name in (*layout.DEPTH_GRAPHS, *layout.NATURAL_GRAPHS):
        assert (workdir / f"graphs/{name}.png").stat().st_size > 10_000
    natural = pd.read_parquet(workdir / "dataset/natural.parquet")
    assert len(natural) == 4 * 2 * 2 and (natural["status"] == "ok").all()
    report = (workdir / "dataset/comparison.md").read_text()
    assert report.startswith("# gridbench mechanism check: llama.cpp on the CPU")
    assert "![natural_tpot_vs_concurrency](../graphs/natural_tpot_vs_concurrency.png)" in report
    assert "| `D_f16_n0` | code | 1 | 30.0 | 300 | 20.0 | c=4: TTFT p50 1200 ms, TPOT p50 20.0 ms |" in report

    assert "prompt class: prose, concurrency 4" in (workdir / layout.EXPLORER).read_text()

    html = build_report(workdir, "grid.yaml")
    for name in (
        "comparison.md",
        "explorer.html",
        "dataset.csv",
        "natural.csv",
        *layout.DEPTH_GRAPHS,
        *layout.NATURAL_GRAPHS,
    ):
        assert name in html, name
    assert "the standard deviation over the runs" in html  # a caption made it in
    if CHROMIUM is None:  # scripts/test.sh installs it, so CI always loads the report
        warnings.warn("no chromium on PATH: report.html was not loaded in a browser", stacklevel=1)
        return
    with Chromium() as browser:  # the report's own scripts must run clean, offline
        browser.load(workdir / "report.html")
        assert browser.errors() == []
        assert browser.evaluate("document.body.innerText.includes('comparison.md')")
        browser.screenshot(REPO / "logs/browser/snakemake-report.png")


@pytest.mark.integration
def test_a_real_cell_gives_graphs_report_and_the_shapes_the_fixtures_assume(workdir, demo_config):
    demo_config["configs"] = {"D_f16_draft4": demo_config["configs"]["D_f16_draft4"]}
    demo_config["depths"] = [0]
    config_path = write_config(workdir / "grid.yaml", demo_config)
    result = snakemake(workdir, "--configfile", "grid.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    for rule in AGGREGATION_RULES:
        assert ran(workdir, rule), rule
    report = (workdir / "dataset/comparison.md").read_text()
    assert (
        "| `D_f16_draft4` | llama.cpp (xllamacpp, CPU) | F16 | random: gridbench assets demo-models "
        "(generated offline) | draft model n=4 |" in report
    )
    assert "Partial results" not in report
    assert "decode_vs_context.png" in build_report(workdir, "grid.yaml")
    # the GPU time ledger from the sweep's own events: its engine is still up while the report
    # is written (the sweep stops it afterwards), so its time ends at its last cell
    assert "| engine starts (1) |" in report and "| measurement (5 cells) |" in report
    assert "1 engine had no stop recorded when this was written" in report
    assert "- GPU time: " in report.split("## Checks")[0]

    # the synthetic records of the report's fixtures have the keys real cells write
    real_raw = json.loads((workdir / "results/raw/D_f16_draft4/depth_0.json").read_text())
    real_prov = json.loads((workdir / "results/raw/D_f16_draft4/depth_0.provenance.json").read_text())
    plan = depth_plan(load_grid_files([config_path]))
    cfg = plan.configs["D_f16_draft4"]
    fake_raw = codec.to_json(
        synthetic.benchy_raw(0, decode=(1.0, 0.0), prefill=(1.0, 0.0), ttft_ms=(1.0, 0.0))
    )
    fake_prov = codec.to_json(synthetic.provenance_record(cfg, "x", spec=synthetic.spec_decode(10, [0.5])))
    assert set(fake_raw) == set(real_raw)
    assert set(fake_raw["benchmarks"][0]) == set(real_raw["benchmarks"][0])
    assert set(fake_prov) == set(real_prov)
    # no NVML on a CPU host: the telemetry says why, with no value and no series file
    assert real_prov["telemetry"]["reason"].startswith("NVML unavailable: ")
    assert real_prov["telemetry"]["energy_j"] is None and real_prov["telemetry"]["samples"] == 0
    assert not list((workdir / "results").rglob("*.telemetry.jsonl"))
    for key in ("engine", "host", "versions", "bench", "spec_decode", "telemetry"):
        assert set(fake_prov[key]) == set(real_prov[key]), key
    grid = load_grid_files([config_path])
    cell = cell_from_grid(grid, "benchy", "D_f16_draft4", ["cpu"], depth=0)
    _write_failure(cell, BenchmarkError("cell D_f16_draft4 depth 0: it broke"), "2026-01-01T00:00:00+00:00")
    real_failure = json.loads(cell.failure_path().read_text())
    assert list(codec.to_json(synthetic.failure_record(plan.cells[0], "x", "y"))) == list(real_failure)
