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
    # every engine pair on the same checkpoint ties at every depth
    ties = next(b for b in verdict.splitlines() if b.startswith("- Engines tie on decode"))
    assert "vLLM 0.24 stock BF16 and eugr/spark-vllm BF16 (0–65536)" in ties
    assert "eugr/spark-vllm NVFP4 and aeon 0.23 NVFP4 (0–65536)" in ties
    assert ties.count(" and ") == 6


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
    assert "vLLM 0.24 stock NVFP4 and eugr/spark-vllm NVFP4" not in verdict
    assert (
        "- vLLM 0.24 stock NVFP4 decodes 1.00–1.01× as fast as eugr/spark-vllm NVFP4: faster at 0, "
        "tie 512–65536 (at 0: 9.00 ± 0.05 vs 8.89 ± 0.04 tok/s;" in verdict
    )


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


def test_capacity_verdict_says_nothing_of_a_config_it_never_measured(seed000):
    grid, frame, natural = seed000
    config = "Q_nvfp4_dflash_k5"
    natural = natural.copy()
    natural.loc[natural["config"] == config, "status"] = "failed"
    verdict = section(render_report(grid, frame, natural), "Verdict")
    assert f"{config} sustains" not in verdict
    assert "sustains" in verdict  # the configs that were measured still get their line


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


@pytest.fixture(scope="module")
def same_weights():
    grid, plan, results, failures = rf.same_weights()
    return grid, rf.depth_frame(plan, results, failures)


def test_engines_on_the_same_weights_are_compared_at_every_depth(same_weights):
    # vLLM's checkpoints (bf16, fp8) and llama.cpp's (gguf_f16, gguf_q8_0) share only `weights`
    engines = section(render_report(*same_weights), "Engine comparison")
    assert [line for line in engines.splitlines() if line.startswith("### ")] == [
        "### vLLM BF16 vs llama.cpp F16",
        "### vLLM BF16 vs llama.cpp Q8_0",
        "### vLLM FP8 vs llama.cpp F16",
        "### vLLM FP8 vs llama.cpp Q8_0",
    ]
    assert (
        "`V_bf16_n0` ÷ `L_f16_n0`, weights `rand3b`: vLLM BF16 decodes 1.82–2.00× as fast as "
        "llama.cpp F16 at every depth 0–65536." in engines
    )
    assert "| 0 | 120 ± 2 | 60.0 ± 1.0 | 2.00 ± 0.05× faster | 50.0 ± 2.0 | 80.0 ± 3.0 |" in engines
    assert "| 65536 | 40.0 ± 1.0 | 22.0 ± 0.5 | 1.82 ± 0.06× faster | 9000 ± 100 | 30000 ± 500 |" in engines
    # slower at every depth: the line names the faster first, the table keeps the declared order
    assert "llama.cpp Q8_0 decodes 1.08–1.12× as fast as vLLM BF16 at every depth 0–65536." in engines
    assert "| 0 | 120 ± 2 | 130 ± 2 | 0.92 ± 0.02× slower |" in engines
    assert "vLLM FP8 decodes 1.00–1.15× as fast as llama.cpp Q8_0: faster 0–4096, tie at 65536." in engines


def test_engine_verdict_is_one_line_per_pair_largest_difference_first(same_weights):
    verdict = section(render_report(*same_weights), "Verdict")
    lines = [line for line in verdict.splitlines() if "vLLM" in line and "llama.cpp" in line]
    assert [line.split(" as fast as ")[0] for line in lines] == [
        "- vLLM FP8 decodes 2.05–2.50×",
        "- vLLM BF16 decodes 1.82–2.00×",
        "- vLLM FP8 decodes 1.00–1.15×",
        "- llama.cpp Q8_0 decodes 1.08–1.12×",
    ]
    assert lines[0].endswith(
        "llama.cpp F16 at every depth 0–65536 (at 0: 150 ± 3 vs 60.0 ± 1.0 tok/s; "
        "at 65536: 45.0 ± 1.0 vs 22.0 ± 0.5 tok/s)."
    )


def test_without_an_engine_pair_the_section_says_why(same_weights, seed000):
    grid, frame = same_weights
    unshared = frame.assign(weights=frame["checkpoint"])  # as if `weights` were not set
    report = render_report(grid, unshared)
    assert section(report, "Engine comparison").strip() == (
        "No two engines share weights: set checkpoints' `weights` to compare them."
    )
    assert "as fast as" not in section(report, "Verdict")
    assert section(render_report(*seed000), "Engine comparison").strip() == "Only one engine in this study."


def test_engine_startup_is_tabled_with_the_study_total(same_weights):
    startup = section(render_report(*same_weights), "Engine start-up")
    assert (
        "Start-up is part of what a sweep costs: 4 starts took 6.1 min in all "
        "(vLLM: 2 starts, 6.0 min; llama.cpp: 2 starts, 8.10 s)." in startup
    )
    assert "| `V_bf16_n0` | vLLM | 185.0 | 3 |" in startup
    assert "| `L_q8_0_n0` | llama.cpp | 3.9 | 3 |" in startup
