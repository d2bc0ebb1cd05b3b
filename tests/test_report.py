"""comparison.md on cells shaped like the seeds' published results: what it must find, and
byte-for-byte what it says (golden files; GRIDBENCH_UPDATE_GOLDEN=1 rewrites them after a
deliberate change, to be reviewed in the diff)."""

from __future__ import annotations

import os

import pandas as pd
import pytest

import report_fixtures as rf
from gridbench import layout
from gridbench.aggregate.report import render_report

GRAPHS = [f"../graphs/{name}.png" for name in layout.DEPTH_GRAPHS]
NATURAL_GRAPHS = GRAPHS + [f"../graphs/{name}.png" for name in layout.NATURAL_GRAPHS]


@pytest.fixture(scope="module")
def seed002():
    grid, plan, results, failures = rf.seed002()
    return grid, rf.depth_frame(plan, results, failures)


@pytest.fixture(scope="module")
def seed000():
    grid, plan, results, failures, nplan, nresults, nfailures = rf.seed000()
    return grid, rf.depth_frame(plan, results, failures), rf.natural_frame(nplan, nresults, nfailures)


def golden(name: str, text: str) -> None:
    path = rf.FIXTURES / name
    if os.environ.get("GRIDBENCH_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; review and rerun with GRIDBENCH_UPDATE_GOLDEN=1"


def section(report: str, title: str) -> str:
    return report.split(f"## {title}\n\n", 1)[1].split("\n## ", 1)[0]


def test_seed002_golden(seed002):
    grid, frame = seed002
    golden("seed002_comparison.md", render_report(grid, frame, None, GRAPHS))


def test_seed002_crossover_between_8k_and_12k(seed002):
    report = render_report(*seed002)
    verdict = section(report, "Verdict")
    line = next(b for b in verdict.splitlines() if b.startswith("- Q_nvfp4_dfl8"))
    assert "over Q_nvfp4_aeon_n0" in line
    assert "stops beating it between 8192 and 12288 tokens (slower from 12288)" in line
    assert "at 12288: 7.50 ± 0.23 vs 8.61 ± 0.04 tok/s" in line
    assert "at 65536: 5.70 ± 0.17 vs 7.71 ± 0.04 tok/s" in line
    speedup = section(report, "Speedup over baseline")
    assert "| `Q_nvfp4_dfl8` | `Q_nvfp4_aeon_n0` | 2.92 ± 0.09× @0 | 0.74 ± 0.02× @65536 |" in speedup
    assert "| 12288 | 0.98 ± 0.03× tie |" in speedup  # n=1 is inside the noise there


def test_seed002_nvfp4_is_twice_bf16_and_engines_tie(seed002):
    verdict = section(render_report(*seed002), "Verdict")
    assert "- NVFP4 ≈ 2.0× BF16 on decode at depth 0" in verdict
    assert "8.90 ± 0.04 vs 4.50 ± 0.02 tok/s" in verdict
    assert "Engines tie on decode, differences within the runs' spread: BF16 · none" in verdict
    assert "NVFP4 · none (vLLM 0.24 stock, eugr/spark-vllm, aeon 0.23: 8.89–8.91 tok/s" in verdict


def test_seed002_summary_and_roofline(seed002):
    report = render_report(*seed002)
    summary = section(report, "Summary: decode tok/s and TTFT by context depth")
    assert summary.splitlines()[0] == (
        "| config | decode @0 (tok/s) | decode @4k (tok/s) | decode @16k (tok/s) | decode @32k (tok/s) "
        "| TTFT @16k (ms) | TTFT @32k (ms) |"
    )
    roofline = section(report, "Roofline realisation")
    assert "| `Q_bf16_aeon_n0` | 51.0 | 5.35 | 0 | 4.51 ± 0.02 | 84 % |" in roofline
    assert "| `Q_nvfp4_aeon_n0` | 23.0 | 11.9 | 0 | 8.91 ± 0.04 | 75 % |" in roofline


def test_a_difference_inside_the_noise_is_called_a_tie(seed002):
    grid, frame = seed002
    frame = frame.copy()
    nvfp4 = frame["config"] == "Q_nvfp4_stock_n0"
    frame.loc[nvfp4 & (frame["context_tokens"] == 0), ["decode_tps", "decode_tps_std"]] = [9.0, 0.05]
    verdict = section(render_report(grid, frame), "Verdict")
    assert "NVFP4 · none (vLLM 0.24 stock, eugr/spark-vllm, aeon 0.23: 8.89–9.00 tok/s" not in verdict
    assert "On NVFP4 · none, vLLM 0.24 stock decodes 1.01 ± 0.01× as fast as eugr/spark-vllm" in verdict


def test_seed000_golden(seed000):
    golden("seed000_comparison.md", render_report(*seed000, NATURAL_GRAPHS))


def test_seed000_roofline_capacity_and_natural_tables(seed000):
    report = render_report(*seed000)
    assert "realises 32 % (Q_fp8_mtp1) to 42 % (Q_nvfp4_dflash_k5, 77.0 of 182 tok/s)" in section(
        report, "Verdict"
    )
    natural = section(report, "Natural prompts")
    # seed 000's published row, verbatim
    assert "| code | 8 | 194 | 25.8 | 883 | 1126 | 36.8 | 40.5 | 512 | 40.8 | 16 / 0 / 0 | 31 % |" in natural
    assert "| prose | 16 | failed |" in natural
    capacity = section(report, "Capacity under latency targets")
    assert "TTFT p50 ≤ 1000 ms and TPOT p50 ≤ 50.0 ms" in capacity
    assert (
        "| `Q_nvfp4_dflash_k5` | code | 8 | 194 | 883 | 36.8 | c=16: TTFT p50 1654 ms, TPOT p50 58.7 ms |"
        in capacity
    )
    assert "| `Q_nvfp4_dflash_k5` | dialogue | none |" in capacity  # TPOT p50 50.3 ms at c=1
    verdict = section(report, "Verdict")
    assert (
        "Q_nvfp4_dflash_k5 sustains c=8 on code, c=4 on reasoning, none on dialogue, c=1 on prose." in verdict
    )
    assert "dialogue (14 of 512 tokens)" in verdict


def test_partial_runs_say_so_and_list_every_failed_cell(seed000):
    grid, frame, natural = seed000
    report = render_report(grid, frame, natural)
    assert report.splitlines()[2].startswith("> **Partial results.** 0 of 3 depth cells and 1 of 48")
    failures = section(report, "Failed and skipped cells")
    assert failures.count("| skipped |") == 3 and failures.count("| failed |") == 1
    assert (
        "error rate 0.25 > max_error_rate 0.1) | `logs/cells/Q_fp8_mtp1/natural_prose_c16.log` |" in failures
    )
    complete = natural.copy()
    complete.loc[complete["status"] == "failed", "status"] = "ok"
    assert "Partial results" not in render_report(grid, frame, complete)


def test_the_report_is_a_pure_function_of_its_inputs(seed000, tmp_path):
    grid, frame, natural = seed000
    first = render_report(grid, frame, natural, NATURAL_GRAPHS)
    assert render_report(grid, frame.copy(), natural.copy(), NATURAL_GRAPHS) == first
    frame.to_parquet(tmp_path / "d.parquet")
    natural.to_parquet(tmp_path / "n.parquet")
    reread = render_report(
        grid, pd.read_parquet(tmp_path / "d.parquet"), pd.read_parquet(tmp_path / "n.parquet"), NATURAL_GRAPHS
    )
    assert reread == first  # what the CLI reads back renders the same bytes


def test_graph_links_are_embedded_in_order(seed002):
    graphs = section(render_report(*seed002, graphs=GRAPHS), "Graphs")
    links = [line.split("(")[1].rstrip(")") for line in graphs.splitlines() if line.startswith("![")]
    assert links == GRAPHS


def test_nothing_measured_still_renders(seed002):
    grid, frame = seed002
    failed = frame.assign(status="failed")
    for column in ("decode_tps", "decode_tps_std", "ttft_ms", "ttft_ms_std"):
        failed[column] = pd.NA
    report = render_report(grid, failed)
    assert "No depth cell was measured" in section(report, "Verdict")
    assert "126 of 126 depth cells failed" in report
