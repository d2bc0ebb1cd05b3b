"""The statistics behind every statement of the report: the tie rule, speedups, the
crossover, baselines, acceptance pooling and capacity."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from gridbench.aggregate import analysis
from gridbench.aggregate.analysis import LOSS, TIE, WIN, Measure
from gridbench.aggregate.report.depth import startup_section
from gridbench.config.grid import StudyInfo


@pytest.mark.parametrize(
    ("a", "b", "outcome"),
    [
        (Measure(10.0, 0.3), Measure(9.6, 0.4), TIE),  # |0.4| <= sqrt(0.09 + 0.16) = 0.5
        (Measure(10.0, 0.3), Measure(9.5, 0.4), TIE),  # exactly the combined spread: still a tie
        (Measure(10.0, 0.3), Measure(9.4, 0.4), WIN),
        (Measure(9.4, 0.4), Measure(10.0, 0.3), LOSS),
        (Measure(8.9, 0.0), Measure(8.9, 0.0), TIE),
        (Measure(8.91, 0.0), Measure(8.9, 0.0), WIN),  # no spread: any difference counts
    ],
)
def test_tie_rule(a, b, outcome):
    assert a.versus(b) == outcome


def test_missing_std_counts_as_zero():
    assert Measure.of(5.0, None) == Measure(5.0, 0.0)
    assert Measure.of(5.0, pd.NA) == Measure(5.0, 0.0)
    assert Measure.of(None, 1.0) is None
    assert Measure.of(float("nan"), 1.0) is None


def test_ratio_propagates_relative_spread():
    ratio = Measure(8.9, 0.089).ratio(Measure(4.5, 0.045))  # 1 % each
    assert ratio.mean == pytest.approx(8.9 / 4.5)
    assert ratio.std == pytest.approx(8.9 / 4.5 * math.sqrt(2) * 0.01)


def frame(rows):
    """A dataset frame from (config, depth, decode, std, method, engine, checkpoint)."""
    records = []
    for config, depth, decode, std, method, engine, checkpoint in rows:
        records.append(
            {
                "config": config,
                "config_label": config,
                "engine": engine,
                "engine_label": engine,
                "engine_kind": "vllm",
                "engine_runtime": "docker",
                "checkpoint": checkpoint,
                "quantization": checkpoint.upper(),
                "speculation": method,
                "speculation_label": method,
                "speculation_method": method,
                "context_tokens": depth,
                "status": "ok" if decode is not None else "failed",
                "decode_tps": decode,
                "decode_tps_std": std,
                "active_weight_gb": 23.0,
            }
        )
    return pd.DataFrame.from_records(records)


def spec_pair(spec_values, base_values, depths):
    rows = [
        ("spec", d, v, s, "dflash", "aeon", "nvfp4") for d, (v, s) in zip(depths, spec_values, strict=True)
    ]
    rows += [
        ("base", d, v, s, "none", "aeon", "nvfp4") for d, (v, s) in zip(depths, base_values, strict=True)
    ]
    return frame(rows)


def test_crossover_between_last_win_and_next_depth():
    depths = [0, 4096, 8192, 12288, 65536]
    data = spec_pair(
        [(26.0, 0.8), (23.0, 0.7), (21.0, 0.6), (7.5, 0.2), (5.7, 0.2)],
        [(8.9, 0.04), (8.8, 0.04), (8.7, 0.04), (8.6, 0.04), (7.7, 0.04)],
        depths,
    )
    (speedup,) = analysis.speedups(data, StudyInfo())
    assert speedup.baseline == "base"
    assert speedup.crossover == (8192, 12288)
    assert speedup.first_loss_after_crossover == 12288
    assert [p.outcome for p in speedup.points] == [WIN, WIN, WIN, LOSS, LOSS]
    assert speedup.runs() == [(WIN, 0, 8192), (LOSS, 12288, 65536)]


def test_a_tie_after_the_wins_still_ends_them():
    data = spec_pair(
        [(12.0, 0.1), (8.75, 0.1), (7.0, 0.1)], [(8.9, 0.1), (8.7, 0.1), (8.6, 0.1)], [0, 8192, 16384]
    )
    (speedup,) = analysis.speedups(data, StudyInfo())
    assert speedup.crossover == (0, 8192)
    assert speedup.first_loss_after_crossover == 16384


@pytest.mark.parametrize(
    ("spec_values", "crossover"),
    [
        ([(12.0, 0.1), (11.0, 0.1)], None),  # always faster
        ([(5.0, 0.1), (4.0, 0.1)], None),  # never faster
        ([(8.9, 0.1), (12.0, 0.1)], None),  # starts with a tie: no leading wins to stop
    ],
)
def test_no_crossover(spec_values, crossover):
    data = spec_pair(spec_values, [(8.9, 0.1), (8.7, 0.1)], [0, 8192])
    (speedup,) = analysis.speedups(data, StudyInfo())
    assert speedup.crossover is crossover


def test_baselines_from_the_study_then_same_engine_and_checkpoint():
    data = frame(
        [
            ("bf16_n0", 0, 4.5, 0.0, "none", "aeon", "bf16"),
            ("nvfp4_n0", 0, 8.9, 0.0, "none", "aeon", "nvfp4"),
            ("nvfp4_stock_n0", 0, 8.9, 0.0, "none", "stock", "nvfp4"),
            ("nvfp4_dfl8", 0, 26.0, 0.0, "dflash", "aeon", "nvfp4"),
            ("bf16_dfl8", 0, 13.0, 0.0, "dflash", "aeon", "bf16"),
            ("lonely_dfl", 0, 13.0, 0.0, "dflash", "other", "bf16"),
        ]
    )
    assert analysis.baselines(data, StudyInfo()) == {"nvfp4_dfl8": "nvfp4_n0", "bf16_dfl8": "bf16_n0"}
    study = StudyInfo(baseline={"nvfp4_n0": "bf16_n0", "bf16_dfl8": "nvfp4_dfl8", "lonely_dfl": "missing"})
    assert analysis.baselines(data, study) == {
        "nvfp4_n0": "bf16_n0",
        "nvfp4_dfl8": "nvfp4_n0",
        "bf16_dfl8": "nvfp4_dfl8",
    }


def test_failed_cells_are_left_out_of_speedups():
    data = spec_pair([(12.0, 0.1), (None, None)], [(8.9, 0.1), (8.7, 0.1)], [0, 8192])
    (speedup,) = analysis.speedups(data, StudyInfo())
    assert [p.depth for p in speedup.points] == [0]


def test_pick_depths_prefers_the_standard_ones():
    seed = [0, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152, 65536]
    assert analysis.pick_depths(seed, analysis.SUMMARY_DECODE_DEPTHS, 4) == [0, 4096, 16384, 32768]
    assert analysis.pick_depths(seed, analysis.SUMMARY_TTFT_DEPTHS, 2) == [16384, 32768]
    assert analysis.pick_depths([0, 256, 512, 1024], analysis.SUMMARY_DECODE_DEPTHS, 4) == [0, 256, 512, 1024]
    assert analysis.pick_depths([0, 256, 512, 1024, 1536], analysis.SUMMARY_TTFT_DEPTHS, 2) == [0, 1536]
    assert analysis.pick_depths([], analysis.SUMMARY_TTFT_DEPTHS, 2) == []


def test_acceptance_per_position_weights_cells_by_their_drafts():
    data = frame(
        [
            ("spec", 0, 10.0, 0.0, "dflash", "aeon", "nvfp4"),
            ("spec", 8192, 8.0, 0.0, "dflash", "aeon", "nvfp4"),
        ]
    )
    data["acceptance_per_position"] = ["[0.8, 0.4]", "[0.2, 0.1]"]
    data["spec_drafts"] = [300.0, 100.0]
    assert analysis.acceptance_by_position(data) == {"spec": pytest.approx([0.65, 0.325])}


def test_capacity_is_the_highest_level_meeting_every_target():
    rows = []
    for c, ttft, tpot in [(1, 557, 15.1), (4, 796, 27.0), (8, 883, 36.8), (16, 1654, 58.7)]:
        rows.append(
            {
                "config": "k5",
                "prompt_class": "code",
                "concurrency": c,
                "status": "ok",
                "ttft_ms_p50": ttft,
                "tpot_ms_p50": tpot,
            }
        )
    rows.append(
        {
            "config": "k5",
            "prompt_class": "dialogue",
            "concurrency": 1,
            "status": "ok",
            "ttft_ms_p50": 549,
            "tpot_ms_p50": 50.3,
        }
    )
    rows.append(
        {
            "config": "k5",
            "prompt_class": "prose",
            "concurrency": 1,
            "status": "failed",
            "ttft_ms_p50": None,
            "tpot_ms_p50": None,
        }
    )
    caps = analysis.capacities(pd.DataFrame(rows), {"ttft_ms_p50": 1000, "tpot_ms_p50": 50})
    assert [(c.prompt_class, c.concurrency) for c in caps] == [
        ("code", 8),
        ("dialogue", None),
        ("prose", None),
    ]
    assert caps[0].first_miss is not None and caps[0].first_miss.concurrency == 16
    assert caps[2].first_miss is None  # nothing was measured there


def test_roofline_is_decode_over_bandwidth_per_active_weights():
    data = frame([("nvfp4_dfl5", 0, 77.0, 1.2, "dflash", "aeon", "nvfp4")])
    data["active_weight_gb"] = [1.5]
    (line,) = analysis.rooflines(data, 273)
    assert line.ceiling_tok_s == pytest.approx(182.0)
    assert line.realised == pytest.approx(77.0 / 182.0)
    assert analysis.rooflines(data, None) == []


def test_engines_pair_on_weights_and_speculation_not_on_names():
    data = frame(
        [
            ("v_bf16", 0, 120.0, 2.0, "none", "vllm", "bf16"),
            ("l_f16", 0, 60.0, 1.0, "none", "llamacpp", "gguf_f16"),
            ("v_fp8", 0, 150.0, 2.0, "none", "vllm", "fp8"),  # vs v_bf16: a checkpoint comparison
            ("l_other", 0, 50.0, 1.0, "none", "llamacpp", "other_f16"),  # other weights
            ("v_ngram4", 0, 150.0, 2.0, "ngram", "vllm", "bf16"),
            ("n_ngram4", 0, 140.0, 2.0, "ngram", "nightly", "bf16"),
            ("n_ngram8", 0, 160.0, 2.0, "ngram", "nightly", "bf16"),  # another draft length
        ]
    )
    data["weights"] = data["checkpoint"].map({"bf16": "w", "fp8": "w", "gguf_f16": "w", "other_f16": "o"})
    data["num_speculative_tokens"] = data["config"].map({"v_ngram4": 4, "n_ngram4": 4, "n_ngram8": 8})
    data["speculation"] = data["config"]  # every speculation name differs
    pairs = [(c.config, c.baseline) for c in analysis.engine_comparisons(data)]
    # vllm comes first in the config order, so it is over llamacpp in every pair
    assert pairs == [("v_bf16", "l_f16"), ("v_fp8", "l_f16"), ("v_ngram4", "n_ngram4")]


def test_engine_comparison_ratios_at_the_depths_both_measured():
    data = frame(
        [
            ("v_bf16", 0, 120.0, 2.0, "none", "vllm", "bf16"),
            ("v_bf16", 4096, 110.0, 2.0, "none", "vllm", "bf16"),
            ("v_bf16", 65536, None, None, "none", "vllm", "bf16"),
            ("l_f16", 0, 60.0, 1.0, "none", "llamacpp", "gguf_f16"),
            ("l_f16", 4096, 121.0, 2.0, "none", "llamacpp", "gguf_f16"),
            ("l_f16", 65536, 22.0, 0.5, "none", "llamacpp", "gguf_f16"),
        ]
    )
    data["weights"] = "w"
    data["num_speculative_tokens"] = None
    (comparison,) = analysis.engine_comparisons(data)
    assert [(p.depth, p.outcome) for p in comparison.points] == [(0, WIN), (4096, LOSS)]
    assert comparison.points[0].speedup.mean == pytest.approx(2.0)
    assert comparison.points[0].speedup.std == pytest.approx(2.0 * math.hypot(2 / 120, 1 / 60))
    assert analysis.fold(comparison) == pytest.approx(2.0)


def test_each_engine_start_counts_once():
    def cell(config, fingerprint, startup_s, reused, status="ok"):
        return {
            "config": config,
            "engine_label": "vLLM",
            "fingerprint": fingerprint,
            "engine_startup_s": startup_s,
            "engine_reused": reused,
            "status": status,
        }

    depth = pd.DataFrame(
        [
            cell("a", "fa", 185.0, False),
            cell("a", "fa", 185.0, True),
            cell("a", "fa", 190.5, False),  # the engine died and the next cell started another
            cell("b", "fb", None, None, status="failed"),  # started the engine, then failed
            cell("b", "fb", 12.0, True),  # that start is known from the cells that reused it
            cell("c", "fb", 12.0, True),  # c differs from b only in labels: the same engine
        ]
    )
    natural = pd.DataFrame([cell("a", "fa", 190.5, True)])
    starts = analysis.engine_starts([depth, None, natural])
    assert [(s.configs, s.startup_s, s.cells) for s in starts] == [
        (("a",), 185.0, 2),
        (("a",), 190.5, 2),
        (("b", "c"), 12.0, 2),
    ]


def test_the_start_up_section_says_which_starts_found_their_compile_cache_warm():
    def cell(config, startup_s, cache):
        return {
            "config": config,
            "engine_label": "vLLM",
            "fingerprint": "f" + config,
            "engine_startup_s": startup_s,
            "engine_reused": False,
            "engine_compile_cache": cache,
            "status": "ok",
        }

    depth = pd.DataFrame([cell("a", 600.0, "miss"), cell("a", 90.0, "hit"), cell("l", 5.0, None)])
    starts = analysis.engine_starts([depth])
    assert [s.compile_cache for s in starts] == ["miss", "hit", None]
    text = startup_section(depth, None)
    assert "1 of the 2 starts that keep a compile cache loaded their compiled graphs from it" in text
    assert "| compile cache |" in text.splitlines()[2]
    assert text.splitlines()[-1].endswith("| — |")  # llama.cpp keeps none
    # a dataset without the column (older provenance) keeps the table as it was
    plain = startup_section(depth.drop(columns="engine_compile_cache"), None)
    assert "compile cache" not in plain


def test_the_start_up_section_counts_the_starts_of_quality_load_and_session_cells():
    """A loan whose sweep stopped vLLM and whose load cells started it again with the compile
    cache warm: that start (56 s against 89 s cold on the H100) is in the table, as are a quality
    cell's own start and a session cell's, counted once for its turns."""

    def cell(config, startup_s, cache, **more):
        row = {"config": config, "engine_label": "vLLM", "fingerprint": "f" + config}
        return row | {"engine_startup_s": startup_s, "engine_compile_cache": cache, "status": "ok", **more}

    depth = pd.DataFrame([cell("a", 89.0, "miss")])
    quality = pd.DataFrame([cell("a", 88.0, "miss")])
    load = pd.DataFrame([cell("a", 56.2, "hit"), cell("a", 56.2, "hit")])
    turns = [cell("a", 87.3, "miss", prompt_class="dialogue", sessions=1, turn=t) for t in (1, 2, 3)]
    text = startup_section(depth, None, quality, load, pd.DataFrame(turns))
    rows = [line for line in text.splitlines() if line.startswith("| `a`")]
    assert rows == [
        "| `a` | vLLM | 89.0 | 1 | miss |",
        "| `a` | vLLM | 88.0 | 1 | miss |",
        "| `a` | vLLM | 56.2 | 2 | hit |",
        "| `a` | vLLM | 87.3 | 1 | miss |",
    ]
    assert "4 starts took" in text and "1 of the 4 starts that keep a compile cache" in text


@pytest.mark.parametrize(
    ("spec_values", "expected"),
    [
        ([(12.0, 0.1), (11.0, 0.1), (10.0, 0.1)], analysis.Pattern(analysis.PAYS_EVERYWHERE)),
        ([(5.0, 0.1), (4.0, 0.1), (3.0, 0.1)], analysis.Pattern(analysis.LOSES_EVERYWHERE)),
        ([(5.0, 0.1), (8.7, 0.1), (8.6, 0.1)], analysis.Pattern(analysis.LOSES_EVERYWHERE)),  # ties, no win
        ([(8.9, 0.1), (8.7, 0.1), (8.6, 0.1)], analysis.Pattern(analysis.TIES_EVERYWHERE)),
        ([(12.0, 0.1), (8.7, 0.1), (3.0, 0.1)], analysis.Pattern(analysis.PAYS_BELOW, 8192)),
        ([(5.0, 0.1), (8.7, 0.1), (12.0, 0.1)], analysis.Pattern(analysis.PAYS_FROM, 32768)),
        ([(12.0, 0.1), (3.0, 0.1), (12.0, 0.1)], analysis.Pattern(analysis.MIXED)),
    ],
)
def test_the_pattern_of_a_ratio_over_depth(spec_values, expected):
    data = spec_pair(spec_values, [(8.9, 0.1), (8.7, 0.1), (8.6, 0.1)], [0, 8192, 32768])
    (speedup,) = analysis.speedups(data, StudyInfo())
    assert analysis.pattern(speedup) == expected


def test_fold_is_the_largest_ratio_either_way_outside_the_spread():
    data = spec_pair([(4.45, 0.1), (8.7, 0.1)], [(8.9, 0.1), (8.7, 0.1)], [0, 8192])
    (speedup,) = analysis.speedups(data, StudyInfo())
    assert analysis.fold(speedup) == pytest.approx(2.0)  # 0.5x counts as much as 2x
    ties = spec_pair([(8.9, 0.1)], [(8.9, 0.1)], [0])
    assert analysis.fold(analysis.speedups(ties, StudyInfo())[0]) == 1.0


def quantized(rows, weights):
    data = frame(rows)
    data["weights"] = data["config"].map(weights)
    data["active_weight_gb"] = data["checkpoint"].map({"bf16": 5.6, "fp8": 2.8, "f16": 5.6, "q8_0": 3.0})
    return data


def test_quantizations_pair_on_one_engine_and_one_model_over_the_most_bytes():
    data = quantized(
        [
            ("V_fp8", 0, 480.0, 5.0, "none", "vllm", "fp8"),
            ("V_bf16", 0, 390.0, 1.0, "none", "vllm", "bf16"),
            ("Q_bf16", 0, 380.0, 1.0, "none", "vllm", "bf16"),  # another model: not paired
            ("V_fp8_spec", 0, 200.0, 1.0, "draft", "vllm", "fp8"),  # speculates: left out
            ("L_q8_0", 0, 410.0, 2.0, "none", "llamacpp", "q8_0"),
            ("L_f16", 0, 365.0, 2.0, "none", "llamacpp", "f16"),
        ],
        {"V_fp8": "rand3b", "V_bf16": "rand3b", "Q_bf16": "qwen3", "V_fp8_spec": "rand3b"}
        | {"L_q8_0": "rand3b", "L_f16": "rand3b"},
    )
    pairs = [(c.config, c.baseline) for c in analysis.quantization_comparisons(data)]
    assert pairs == [("V_fp8", "V_bf16"), ("L_q8_0", "L_f16")]
    # weights that no checkpoint declares: one model per engine, as in a grid that only quantizes
    undeclared = data.assign(weights=data["checkpoint"])
    undeclared = undeclared[undeclared["config"] != "Q_bf16"]
    pairs = [(c.config, c.baseline) for c in analysis.quantization_comparisons(undeclared)]
    assert pairs == [("V_fp8", "V_bf16"), ("L_q8_0", "L_f16")]


def test_depth_costs_from_the_shallowest_to_the_deepest_depth():
    data = spec_pair([(12.0, 0.1), (6.0, 0.1)], [(8.0, 0.1), (None, None)], [0, 65536])
    data = data.assign(ttft_ms=[50.0, 9000.0, 50.0, None], ttft_ms_std=0.0)
    (cost,) = analysis.depth_costs(data)  # base measured one depth only
    assert (cost.config, cost.first_depth, cost.last_depth) == ("spec", 0, 65536)
    assert cost.kept == pytest.approx(0.5)
    assert cost.last_ttft_ms == Measure(9000.0, 0.0)


def natural_levels(rows):
    columns = [
        "config",
        "prompt_class",
        "concurrency",
        "status",
        "req_tok_s_p50",
        "output_tok_s",
        "gpu_count",
    ]
    frame = pd.DataFrame(rows, columns=columns)
    return frame.assign(ttft_ms_p50=100.0, tpot_ms_p50=[10.0 * r[2] for r in rows])


def test_pareto_frontier_keeps_the_levels_no_other_beats_on_both_axes():
    natural = natural_levels(
        [
            ("A", "code", 1, "ok", 100.0, 100.0, 1),  # most interactive: frontier
            ("A", "code", 8, "ok", 40.0, 320.0, 1),  # frontier
            ("B", "code", 1, "ok", 90.0, 90.0, 1),  # beaten by A c=1 on both
            ("B", "code", 8, "ok", 40.0, 300.0, 1),  # as interactive as A c=8, less throughput
            ("C", "code", 16, "ok", 20.0, 640.0, 2),  # 320 per GPU at 20 per user: beaten by A c=8
            ("C", "code", 32, "failed", 50.0, 9999.0, 2),  # failed: never a point
            ("B", "prose", 4, "ok", 10.0, 40.0, None),  # alone in its class (no GPU count: 1)
        ]
    )
    points = analysis.pareto_points(natural, {})
    frontier = {(p.config, p.prompt_class, p.concurrency) for p in points if p.on_frontier}
    assert frontier == {("A", "code", 1), ("A", "code", 8), ("B", "prose", 4)}
    c16 = next(p for p in points if p.config == "C")
    assert (c16.tok_s_per_gpu, c16.gpus) == (320.0, 2) and len(points) == 6
    assert all(p.meets_targets is None for p in points)


def test_the_best_level_under_targets_is_the_most_throughput_per_gpu_that_meets_them():
    natural = natural_levels(
        [
            ("A", "code", 1, "ok", 100.0, 100.0, 1),  # TPOT 10 ms
            ("A", "code", 4, "ok", 60.0, 240.0, 1),  # TPOT 40 ms
            ("A", "code", 8, "ok", 40.0, 320.0, 1),  # TPOT 80 ms: misses
        ]
    )
    points = analysis.pareto_points(natural, {"tpot_ms_p50": 50.0})
    best = analysis.best_under_targets(points)["code"]
    assert (best.config, best.concurrency, best.on_frontier) == ("A", 4, True)
    assert [p.meets_targets for p in points] == [True, True, False]


def test_a_cell_read_from_its_row_has_a_measure_only_where_it_was_measured():
    cells = analysis.cell_index(
        frame([("a", 0, 10.0, None, "none", "e", "c"), ("a", 512, None, None, "none", "e", "c")])
    )
    assert cells[("a", 0)].measure("decode_tps") == Measure(10.0, 0.0)  # a missing std counts as 0
    assert cells[("a", 0)].measure("ttft_ms") is None  # a column the dataset lacks
    assert cells[("a", 512)].status == "failed" and cells[("a", 512)].measure("decode_tps") is None
    assert analysis.measure_at(cells, "a", 1024, "decode_tps") is None  # not in the grid


def test_a_config_without_declared_weights_holds_its_checkpoints_model():
    rows = frame([("a", 0, 10.0, 0.1, "none", "e", "f16"), ("b", 0, 12.0, 0.1, "none", "e", "q8")])
    rows["weights"] = ["m", pd.NA]
    a, b = analysis.config_identities(rows)
    assert (a.model, b.model) == ("m", "q8")
    assert (a.weights, b.weights) == ("m", None)


def test_a_start_made_of_its_compile_cache_what_vllms_log_says():
    """vLLM's lines (vllm/compilation/backends.py, decorators.py): any compilation is a miss,
    even of a start that found a warm folder; loading alone is a hit; silence is a miss over an
    empty folder and unknown over a warm one."""
    from gridbench.engines.compile_cache import HIT, MISS, UNKNOWN, outcome
    from gridbench.engines.kinds import engine_kind

    vllm, llamacpp = engine_kind("vllm"), engine_kind("llamacpp")
    loaded = (
        "INFO [backends.py:296] Directly load the compiled graph(s) for compile range (1, 8192) "
        "from the cache, took 0.412 s"
    )
    compiled = "INFO [backends.py:399] Compiling a graph for compile range (1, 8192) takes 11.20 s"
    again = (
        "WARNING [decorators.py:334] Compiling model again due to a load failure from /c/model, reason: bad"
    )
    aot = "INFO [decorators.py:319] Directly load AOT compilation from path /c/torch_aot_compile/model"
    assert outcome(vllm, f"start\n{loaded}\nready", 12) == HIT
    assert outcome(vllm, aot, 3) == HIT
    assert outcome(vllm, f"{aot}\n{compiled}", 3) == MISS
    assert outcome(vllm, again, 12) == MISS and outcome(vllm, compiled, 0) == MISS
    assert outcome(vllm, "no such lines", 0) == MISS and outcome(vllm, "no such lines", 5) == UNKNOWN
    assert outcome(llamacpp, loaded, 5) == UNKNOWN  # a kind without such lines says nothing
