"""comparison.md on cells shaped like the seeds' published results: what it must find, and
byte-for-byte what it says (golden files; GRIDBENCH_UPDATE_GOLDEN=1 rewrites them after a
deliberate change, to be reviewed in the diff)."""

from __future__ import annotations

import os
from dataclasses import replace

import pandas as pd
import pytest

import report_fixtures as rf
from conftest import REPO, load_yaml
from gridbench import layout
from gridbench.aggregate import load as load_rows
from gridbench.aggregate import quality as quality_rows
from gridbench.aggregate import sessions as session_rows
from gridbench.aggregate.checks import Check, run_checks
from gridbench.aggregate.report import render_report
from gridbench.aggregate.text import and_list
from gridbench.cells.plan import load_plan, quality_plan, session_plan
from gridbench.config.grid import WeightsOrigin
from gridbench.config.loading import load_grid

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
    # the three DFlash configs share the conclusion: one line, the depth a user acts on first
    (line,) = [b for b in verdict.splitlines() if b.startswith("- DSpark-DFlash")]
    assert line.startswith(
        "- DSpark-DFlash n=1 (Q_bf16_dfl1), n=8 (Q_bf16_dfl8) and n=8 (Q_nvfp4_dfl8) pay off over their "
        "baselines (Q_bf16_aeon_n0 and Q_nvfp4_aeon_n0) only below 12k of context ("
    )
    assert "Q_nvfp4_dfl8 faster 0–8192, slower 12288–65536" in line
    assert "Q_bf16_dfl1 faster 0–8192, tie at 12288, slower 16384–65536" in line
    assert line.endswith("0.73 ± 0.02× (Q_bf16_dfl8 at 65536) to 2.92 ± 0.09× (Q_nvfp4_dfl8 at 0).")
    speedup = section(report, "Speedup over baseline")
    assert "| `Q_nvfp4_dfl8` | `Q_nvfp4_aeon_n0` | 2.92 ± 0.09× @0 | 0.74 ± 0.02× @65536 |" in speedup
    assert "| 12288 | 0.98 ± 0.03× tie |" in speedup  # n=1 is inside the noise there


def test_seed002_nvfp4_is_twice_bf16_and_engines_tie(seed002):
    verdict = section(render_report(*seed002), "Verdict")
    # one line for the quantization axis: the three engines where NVFP4 reads the same merged
    assert (
        "- Quantization, without speculation: NVFP4 decodes faster than BF16 on vLLM 0.24 stock, "
        "eugr/spark-vllm and aeon 0.23 at every depth measured (0–65536), 1.88 ± 0.01× "
        "(Q_nvfp4_aeon_n0 at 65536) to 1.98 ± 0.01× (Q_nvfp4_eugr_n0 at 0), reading 0.45× the bytes "
        "per token." in verdict
    )
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
        "- vLLM 0.24 stock decodes faster than eugr/spark-vllm on the same weights only below 512 of "
        "context (faster at 0, tie 512–65536) for NVFP4 (1.00 ± 0.01× at 512 to 1.01 ± 0.01× at 0)."
        in verdict
    )


def test_seed000_golden(seed000):
    golden("seed000_comparison.md", render_report(*seed000, NATURAL_GRAPHS))


def test_seed000_roofline_capacity_and_natural_tables(seed000):
    report = render_report(*seed000)
    assert (
        "realises 32 % (Q_fp8_mtp1) to 42 % (Q_nvfp4_dflash_k5, 77.0 of 182 tok/s) with speculation"
        in section(report, "Verdict")
    )
    natural = section(report, "Natural prompts")
    # seed 000's published row, verbatim
    assert (
        "| code | 8 | 194 | 25.8 | 883 | 1126 | 36.8 | 40.5 | 512 | 0 of 16 | 40.8 | 16 / 0 / 0 | 31 % |"
        in natural
    )
    assert "| prose | 16 | failed |" in natural
    capacity = section(report, "Capacity under latency targets")
    assert "TTFT p50 ≤ 1000 ms and TPOT p50 ≤ 50.0 ms" in capacity
    assert (
        "| `Q_nvfp4_dflash_k5` | code | 8 | 194 | 883 | 36.8 | c=16: TTFT p50 1654 ms, TPOT p50 58.7 ms |"
        in capacity
    )
    assert "| `Q_nvfp4_dflash_k5` | dialogue | none |" in capacity  # TPOT p50 50.3 ms at c=1
    verdict = section(report, "Verdict")
    # one line for capacity: per class, the configs that sustain the same level merged
    assert (
        "- Under TTFT p50 ≤ 1000 ms and TPOT p50 ≤ 50.0 ms: on code, Q_nvfp4_dflash_k5 and "
        "Q_nvfp4_dflash_k15 sustain c=8 and Q_fp8_mtp1 c=1; on reasoning, Q_nvfp4_dflash_k5 and "
        "Q_nvfp4_dflash_k15 sustain c=4 and Q_fp8_mtp1 c=1; on dialogue, none of the 3 configs at any "
        "level; on prose, Q_nvfp4_dflash_k5 and Q_nvfp4_dflash_k15 sustain c=1 and Q_fp8_mtp1 no level."
        in verdict
    )
    assert "dialogue (median 14 of 512 tokens" in verdict


def test_capacity_verdict_says_nothing_of_a_config_it_never_measured(seed000):
    grid, frame, natural = seed000
    config = "Q_nvfp4_dflash_k5"
    natural = natural.copy()
    natural.loc[natural["config"] == config, "status"] = "failed"
    verdict = section(render_report(grid, frame, natural), "Verdict")
    capacity = next(b for b in verdict.splitlines() if b.startswith("- Under TTFT"))
    assert config not in capacity
    assert "on code, Q_nvfp4_dflash_k15 sustains c=8 and Q_fp8_mtp1 c=1" in capacity


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


def test_failed_quality_load_and_session_cells_make_the_report_partial_and_are_listed(seed002):
    grid, frame = seed002
    config = load_yaml(REPO / "config/demo.yaml")
    config["load"] = {"prompt_classes": ["code"], "rates": [2, 8], "requests": 8}
    config["sessions"] = {"sessions": [1, 4], "turns": 3}
    demo = load_grid(config, "demo.yaml")
    # none of these cells left a result: each is a failed row, as after a sweep that stopped
    quality = quality_rows.to_frame(quality_rows.rows_from_results(quality_plan(demo), {}, {}))
    load = load_rows.to_frame(load_rows.rows_from_results(load_plan(demo), {}, {}))
    sessions = session_rows.to_frame(session_rows.rows_from_results(session_plan(demo), {}, {}))
    complete = render_report(grid, frame)
    assert "Partial results" not in complete
    report = render_report(grid, frame, quality=quality, load=load, sessions=sessions)
    assert report.splitlines()[2] == (
        "> **Partial results.** 0 of 126 depth cells and 4 of 4 quality cells and 8 of 8 load cells "
        "and 8 of 8 session cells failed. They are listed with their reasons under [Failed and skipped "
        "cells](#failed-and-skipped-cells); no value, graph or statement below comes from them."
    )
    failures = section(report, "Failed and skipped cells")
    assert failures.count("| failed |") == 4 + 8 + 8  # a session cell once, not once per turn
    assert "| `S_q4_1_draft4` | quality | failed | no result: the cell did not run" in failures
    assert "| `S_q4_1_n0` | code poisson at 8 req/s | failed |" in failures
    assert "| `S_q8_0_n0` | dialogue sessions=4 | failed |" in failures
    assert "`logs/cells/S_q8_0_n0/sessions_dialogue_s4.log`" in failures


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


def test_engine_verdict_is_one_line_per_engine_pair_its_conclusions_merged(same_weights):
    verdict = section(render_report(*same_weights), "Verdict")
    (line,) = [line for line in verdict.splitlines() if " than llama.cpp on the same weights" in line]
    assert line == (
        "- vLLM decodes faster than llama.cpp on the same weights at every depth measured (0–65536) "
        "for BF16 over F16 (1.82 ± 0.06× at 65536 to 2.00 ± 0.05× at 0) and FP8 over F16 "
        "(2.05 ± 0.07× at 65536 to 2.50 ± 0.07× at 0); slower at every depth measured (0–65536) for "
        "BF16 over Q8_0 (0.89 ± 0.03× at 65536 to 0.92 ± 0.02× at 0); only below 64k of context "
        "(faster 0–4096, tie at 65536) for FP8 over Q8_0 (1.00 ± 0.03× at 65536 to 1.15 ± 0.03× at 0)."
    )


def test_verdict_lines_are_ordered_by_effect_largest_first(same_weights):
    verdict = section(render_report(*same_weights), "Verdict").splitlines()
    # context costs up to 1 / 0.30 = 3.3x, engines up to 2.50x, quantization up to 2.18x
    assert [line.split(" ")[1] for line in verdict] == ["Context", "vLLM", "Quantization,"]
    assert verdict[0] == (
        "- Context depth: from depth 0 to 65536, decode keeps 30 % (V_fp8_n0, 150 ± 3 → 45.0 ± 1.0 "
        "tok/s) to 37 % (L_f16_n0, 60.0 ± 1.0 → 22.0 ± 0.5 tok/s) of its rate; TTFT there is 9000 ms "
        "(V_bf16_n0) to 30000 ms (L_f16_n0)."
    )
    # a larger engine gap moves the engine line first
    grid, frame = same_weights
    faster = frame.copy()
    vllm_fp8 = faster["config"] == "V_fp8_n0"
    faster.loc[vllm_fp8, "decode_tps"] = faster.loc[vllm_fp8, "decode_tps"] * 2
    reordered = section(render_report(grid, faster), "Verdict").splitlines()
    assert [line.split(" ")[1] for line in reordered] == ["vLLM", "Context", "Quantization,"]


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


# --- checks -----------------------------------------------------------------------------


def checks(grid, frame, natural=None) -> dict[str, Check]:
    return {c.title: c for c in run_checks(frame, natural, grid.study)}


def test_every_check_has_a_line_and_a_clean_study_triggers_none(seed002):
    report = render_report(*seed002)
    lines = section(report, "Checks").splitlines()[2:]
    assert len(lines) == 8 and all(line.startswith("- ok — ") for line in lines)
    assert "**warning**" not in report and "[Checks](#checks)" not in report


def test_latency_that_falls_as_load_rises_is_flagged_with_its_cause(seed000):
    grid, frame, natural = seed000
    assert not checks(grid, frame, natural)["latency falls as load rises"].triggered
    natural = natural.copy()
    cell = (natural["config"] == "Q_fp8_mtp1") & (natural["prompt_class"] == "code")
    natural.loc[cell & (natural["concurrency"] == 16), "ttft_ms_p50"] = 138.0  # 971 ms at c=8
    # the engine's kind, not its name, says where the cause is known
    natural.loc[cell, "engine"] = "spark-llama"
    natural.loc[cell, "engine_kind"] = "llamacpp"
    natural.loc[cell, "serve_command"] = "llama-server -m model.gguf --no-cache-prompt"
    check = checks(grid, frame, natural)["latency falls as load rises"]
    assert check.findings == ("Q_fp8_mtp1 on code: TTFT p50 971 ms at c=8, 138 ms at c=16",)
    assert "host prompt cache" in check.cause and "Q_fp8_mtp1 ran without it" in check.cause
    natural.loc[cell, "serve_command"] = "llama-server -m model.gguf --cache-ram 0"
    assert (
        "ran with it, so look elsewhere" in checks(grid, frame, natural)["latency falls as load rises"].cause
    )
    report = render_report(grid, frame, natural)
    line = next(b for b in section(report, "Checks").splitlines() if "load" in b)
    assert line.startswith("- **warning** — latency falls as load rises: Q_fp8_mtp1 on code")
    assert section(report, "Verdict").endswith(
        "- Read these with the [Checks](#checks): 2 of 8 warn (latency falls as load rises; "
        "errors or incomplete requests).\n"
    )


def test_a_cached_context_no_faster_than_cold_is_flagged(seed002):
    grid, frame = seed002
    assert checks(grid, frame)["cached context no faster than cold"].passed.startswith("not checked")
    frame = frame.copy()
    frame["ttft_ms_cached"] = frame["ttft_ms"] / 10  # a cache that works
    config, depth = frame.iloc[3][["config", "context_tokens"]]
    assert not checks(grid, frame)["cached context no faster than cold"].triggered
    missed = (frame["config"] == config) & (frame["context_tokens"] == depth)
    frame.loc[missed, "ttft_ms_cached"] = frame.loc[missed, "ttft_ms"] * 1.5
    check = checks(grid, frame)["cached context no faster than cold"]
    assert len(check.findings) == 1 and check.findings[0].startswith(f"{config} at depth {depth}: cold ")
    assert "cache missed" in check.cause


def test_a_drop_within_the_tolerance_is_not_flagged(seed000):
    grid, frame, natural = seed000
    natural = natural.copy()
    cell = (natural["config"] == "Q_fp8_mtp1") & (natural["prompt_class"] == "code")
    natural.loc[cell & (natural["concurrency"] == 16), "ttft_ms_p50"] = 809.0  # 971 ms at c=8: 17 % lower
    assert not checks(grid, frame, natural)["latency falls as load rises"].triggered


def test_acceptance_near_zero_with_speculation_on(seed000):
    grid, frame, natural = seed000
    assert not checks(grid, frame, natural)["acceptance ≈ 0 with speculation on"].triggered
    frame, natural = frame.copy(), natural.copy()
    for f in (frame, natural):
        f.loc[f["config"] == "Q_nvfp4_dflash_k15", "acceptance_rate"] = 0.002
    check = checks(grid, frame, natural)["acceptance ≈ 0 with speculation on"]
    assert check.findings == ("Q_nvfp4_dflash_k15 accepts at most 0 % over 17 cells",)


def test_decode_above_the_roofline_without_speculation(seed002):
    grid, frame = seed002
    frame = frame.copy()
    cell = (frame["config"] == "Q_bf16_aeon_n0") & (frame["context_tokens"] == 0)
    frame.loc[cell, "decode_tps"] = 6.2  # the ceiling is 273 GB/s ÷ 51 GB = 5.35 tok/s
    check = checks(grid, frame)["decode above the bandwidth roofline without speculation"]
    assert check.findings == ("Q_bf16_aeon_n0 decodes 6.20 tok/s at depth 0, above its 5.35 tok/s ceiling",)
    # a speculative config above it is what speculation is for
    spec = (frame["config"] == "Q_bf16_dfl8") & (frame["context_tokens"] == 0)
    assert float(frame.loc[spec, "decode_tps"].iloc[0]) > 5.35
    assert len(check.findings) == 1


def test_errored_and_incomplete_requests_and_failed_cells(seed000, seed002):
    grid, frame, natural = seed000
    check = checks(grid, frame, natural)["errors or incomplete requests"]
    assert check.findings == ("1 cell failed (listed under Failed and skipped cells)",)
    natural = natural.copy()
    cell = (
        (natural["config"] == "Q_nvfp4_dflash_k5")
        & (natural["prompt_class"] == "code")
        & (natural["concurrency"] == 8)
    )
    natural.loc[cell, ["errored", "incomplete"]] = [2, 1]
    check = checks(grid, frame, natural)["errors or incomplete requests"]
    assert "Q_nvfp4_dflash_k5 code c=8: 2 errored, 1 incomplete of 16 requests" in check.findings
    assert not checks(*seed002)["errors or incomplete requests"].triggered


def test_a_ratio_whose_spread_exceeds_its_effect(same_weights):
    grid, frame = same_weights
    # V_fp8_n0 ÷ L_q8_0_n0 at 65536 is 1.00 ± 0.03: called a tie, so nothing to flag
    assert not checks(grid, frame)["a spread larger than the effect it qualifies"].triggered
    frame = frame.copy()
    cell = (frame["config"] == "L_f16_n0") & (frame["context_tokens"] == 0)
    # 120 ± 2 against 60 ± 35: the means differ by more than their spread (faster), but the
    # ratio 2.00 ± 1.17 does not exclude 1
    frame.loc[cell, "decode_tps_std"] = 35.0
    check = checks(grid, frame)["a spread larger than the effect it qualifies"]
    assert "V_bf16_n0 ÷ L_f16_n0 at depth 0: 2.00 ± 1.17×, called faster" in check.findings


def test_an_engine_restarted_within_a_config(same_weights):
    grid, frame = same_weights
    assert not checks(grid, frame)["engine restarted within a config"].triggered
    frame = frame.copy()
    cell = (frame["config"] == "V_bf16_n0") & (frame["context_tokens"] == 65536)
    frame.loc[cell, "engine_startup_s"] = 190.0
    check = checks(grid, frame)["engine restarted within a config"]
    assert check.findings == ("V_bf16_n0: 2 starts (185.0 s, 190.0 s)",)


def test_configs_measured_on_different_machines_are_named_by_machine(same_weights):
    grid, frame = same_weights
    assert checks(grid, frame)["configs measured on different machines"].passed.startswith("not checked")
    frame = frame.assign(telemetry_gpu_ids="GPU-c41da9f0-4b45-2194-4d01-c12e4d85c7ff")
    assert not checks(grid, frame)["configs measured on different machines"].triggered
    other_gpu = "GPU-e9484e34-097b-fca6-6a52-579452b5c1d2"
    frame.loc[frame["config"] == "V_bf16_n0", "telemetry_gpu_ids"] = other_gpu
    check = checks(grid, frame)["configs measured on different machines"]
    others = [c for c in frame.query("status == 'ok'")["config"].unique() if c != "V_bf16_n0"]
    assert set(check.findings) == {f"{and_list(others)} on GPU-c41da9f0", "V_bf16_n0 on GPU-e9484e34"}
    assert "measure the baseline again on each" in check.summary


def test_speculation_verdict_says_where_it_pays_off_in_words_a_user_acts_on(seed002):
    grid, frame = seed002
    frame = frame.copy()
    dfl8 = frame["config"] == "Q_bf16_dfl8"
    frame.loc[dfl8, ["decode_tps", "decode_tps_std"]] = [1.0, 0.01]  # slower everywhere
    dfl1 = frame["config"] == "Q_bf16_dfl1"
    deep = frame["context_tokens"] >= 32768
    frame.loc[dfl1 & ~deep, ["decode_tps", "decode_tps_std"]] = [1.0, 0.01]
    frame.loc[dfl1 & deep, ["decode_tps", "decode_tps_std"]] = [9.0, 0.01]  # faster from 32k on
    report = render_report(grid, frame)
    verdict = section(report, "Verdict")
    (loses,) = [line for line in verdict.splitlines() if line.startswith("- DSpark-DFlash n=8 (Q_bf16_dfl8)")]
    assert loses.startswith(
        "- DSpark-DFlash n=8 (Q_bf16_dfl8) loses to Q_bf16_aeon_n0 at every depth measured (0–65536): "
    )
    assert loses.endswith("; don't use it here.")
    (late,) = [line for line in verdict.splitlines() if line.startswith("- DSpark-DFlash n=1 (Q_bf16_dfl1)")]
    assert late.startswith(
        "- DSpark-DFlash n=1 (Q_bf16_dfl1) pays off over Q_bf16_aeon_n0 only from 32k of context on "
        "(slower 0–24576, faster 32768–65536): "
    )
    speedup = section(report, "Speedup over baseline")
    assert "| `Q_bf16_dfl8` | `Q_bf16_aeon_n0` |" in speedup
    assert "slower at every depth measured (0–65536) |" in speedup


def _with_origin(grid, kinds: dict[str, str]):
    """The grid with the checkpoints of ``kinds`` declaring real or random weights."""
    configs = {
        name: replace(
            cfg, checkpoint=replace(cfg.checkpoint, origin=WeightsOrigin(kinds[cfg.checkpoint.name]))
        )
        if cfg.checkpoint.name in kinds
        else cfg
        for name, cfg in grid.configs.items()
    }
    return replace(grid, configs=configs)


def test_findings_on_random_weights_follow_the_real_ones_labelled_as_mechanism_checks(seed002):
    grid, frame = seed002
    unlabelled = section(render_report(grid, frame), "Verdict")
    assert "Mechanism check" not in unlabelled
    checkpoints = {cfg.checkpoint.name for cfg in grid.configs.values()}
    random_one = sorted(checkpoints)[0]
    mixed = _with_origin(grid, {name: "real" if name != random_one else "random" for name in checkpoints})
    report = render_report(mixed, frame)
    lines = section(report, "Verdict").splitlines()
    labelled = [i for i, line in enumerate(lines) if line.startswith("- Mechanism check: ")]
    real = [i for i, line in enumerate(lines) if line.startswith("- ") and "echanism check" not in line]
    assert labelled and real and max(real[:-1]) < min(labelled)  # real findings lead ([Checks] last)
    random_configs = [n for n, cfg in grid.configs.items() if cfg.checkpoint.name == random_one]
    header = lines[labelled[0] - 1]
    assert header.endswith(
        "serve random weights: the mechanism checks below show that engines, counters "
        "and harness work, not how these methods perform on a real model."
    )
    assert all(name in header for name in random_configs)
    assert "| random |" in section(report, "Configs") and "| real |" in section(report, "Configs")
    all_random = _with_origin(grid, dict.fromkeys(checkpoints, "random"))
    verdict = section(render_report(all_random, frame), "Verdict")
    assert verdict.startswith("- Every checkpoint measured here holds random weights")
    assert all(
        line.startswith("- Mechanism check") for line in verdict.splitlines()[1:] if "[Checks]" not in line
    )


def test_acceptance_by_prompt_class_is_tabled_and_a_spread_is_a_finding(seed000):
    grid, frame, natural = seed000
    config = "Q_nvfp4_dflash_k5"
    natural = natural.copy()
    rates = {"code": 0.75, "reasoning": 0.78, "dialogue": 0.45, "prose": 0.30}
    for prompt_class, rate in rates.items():
        natural.loc[
            (natural["config"] == config) & (natural["prompt_class"] == prompt_class), "acceptance_rate"
        ] = rate
    report = render_report(grid, frame, natural)
    table = section(report, "Acceptance by prompt class")
    assert "| `Q_nvfp4_dflash_k5` | reasoning | 1 | 78 % |" in table
    assert "`Q_nvfp4_dflash_k5` at c=1: acceptance 78 % on reasoning down to 30 % on prose." in table
    assert (
        "- Acceptance depends on the prompt class: Q_nvfp4_dflash_k5 at c=1 accepts 78 % of drafted "
        "tokens on reasoning but 30 % on prose; quote its speed with the workload."
        in section(report, "Verdict")
    )
    # the same acceptance on every class is no finding
    assert "Acceptance depends" not in section(
        render_report(grid, frame, natural.assign(acceptance_rate=0.5)), "Verdict"
    )


def test_answers_that_end_on_eos_are_counted_and_named_in_the_verdict(seed000):
    grid, frame, natural = seed000
    natural = natural.copy()
    natural["ended_on_eos"] = 0
    dialogue = natural["prompt_class"] == "dialogue"
    natural.loc[dialogue, "ended_on_eos"] = natural.loc[dialogue, "ok"]
    report = render_report(grid, frame, natural)
    ok = int(natural.loc[dialogue & (natural["status"] == "ok"), "ok"].sum())
    assert f"dialogue (median 14 of 512 tokens, {ok} of {ok} ended on EOS)" in section(report, "Verdict")
    assert "| dialogue | 1 | 12.0 |" in section(report, "Natural prompts")
    # answers ending on EOS are the finding even where the median output is not that short
    longer = natural.assign(output_tokens_p50=natural["output_tokens_p50"].where(~dialogue, 400))
    assert "dialogue (median 400 of 512 tokens" in section(render_report(grid, frame, longer), "Verdict")
    ended_on_length = natural.assign(
        ended_on_eos=0, output_tokens_p50=natural["output_tokens_p50"].where(~dialogue, 400)
    )
    assert "Answers stop short" not in section(render_report(grid, frame, ended_on_length), "Verdict")
    # one answer in sixteen ending early is no finding; a quarter is
    rare = ended_on_length.assign(ended_on_eos=natural["ended_on_eos"].where(~dialogue, 1))
    assert "Answers stop short" not in section(render_report(grid, frame, rare), "Verdict")
    quarter = ended_on_length.assign(ended_on_eos=natural["ended_on_eos"].where(~dialogue, 4))
    assert "Answers stop short" in section(render_report(grid, frame, quarter), "Verdict")
    assert "| 16 of 16 |" in section(report, "Natural prompts")


def test_the_seeds_phenomena_are_judged_each_shown_or_not_with_its_numbers(seed002, seed000):
    grid, frame = seed002
    report = render_report(grid, frame)
    table = section(report, "The seeds' speculation phenomena")
    # seed 002's DFlash: the speed-up collapses with depth, acceptance decays by position
    assert (
        "| `Q_bf16_dfl8` | — (not measured on two prompt classes) | shown: 43 % at position 1, 5 % at 8 "
        "| shown: 2.90 ± 0.09× at 0 → 0.73 ± 0.02× at 64k (lowest 0.73 ± 0.02× at 64k, highest "
        "2.90 ± 0.09× at 0) |" in table
    )
    assert "| `Q_bf16_dfl1` | — (not measured on two prompt classes) | — (one position drafted) |" in table
    assert section(report, "Verdict").startswith(
        "- The seeds' speculation findings, on these weights: acceptance decays by draft position for "
        "2 of 2 (Q_bf16_dfl8 and Q_nvfp4_dfl8); speed-up changes with context depth for 3 of 3"
    )
    # a speed-up that stays within its spread across depths does not change
    flat = frame.copy()
    dfl8 = flat["config"] == "Q_bf16_dfl8"
    base = flat[flat["config"] == "Q_bf16_aeon_n0"].set_index("context_tokens")["decode_tps"]
    flat.loc[dfl8, "decode_tps"] = flat.loc[dfl8, "context_tokens"].map(base * 1.5)
    assert "| not shown: 1.50 ± " in section(render_report(grid, flat), "The seeds' speculation phenomena")

    # seed 000: one acceptance on every class is "not shown"; a spread is "shown"
    grid, frame, natural = seed000
    table = section(render_report(grid, frame, natural), "The seeds' speculation phenomena")
    assert (
        "| `Q_nvfp4_dflash_k5` | not shown: code 31 % · reasoning 31 % · dialogue 31 % · prose 31 % "
        "at c=1 (0 pp)" in table
    )
    k5 = natural["config"] == "Q_nvfp4_dflash_k5"
    spread = natural.assign(
        acceptance_rate=natural["acceptance_rate"].where(~k5 | (natural["prompt_class"] != "prose"), 0.1)
    )
    table = section(render_report(grid, frame, spread), "The seeds' speculation phenomena")
    assert (
        "| `Q_nvfp4_dflash_k5` | shown: code 31 % · reasoning 31 % · dialogue 31 % · prose 10 % "
        "at c=1 (21 pp)" in table
    )

    # configs on random weights are not judged, and the verdict claims nothing for them
    grid, frame = seed002
    checkpoints = {cfg.checkpoint.name for cfg in grid.configs.values()}
    report = render_report(_with_origin(grid, dict.fromkeys(checkpoints, "random")), frame)
    assert section(report, "The seeds' speculation phenomena").endswith(
        "Not judged: `Q_bf16_dfl1`, `Q_bf16_dfl8` and `Q_nvfp4_dfl8` serve random weights, which show "
        "that engines, counters and harness work, not how these methods perform on a real model.\n"
    )
    assert "seeds' speculation findings" not in section(report, "Verdict")
