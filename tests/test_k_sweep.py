"""Draft length k: which configs form a k-sweep family, the best k at each point of its
sweep against the largest k and the baseline, and the report's section that says so."""

from __future__ import annotations

import copy
from dataclasses import asdict

import pandas as pd
import pytest

import report_fixtures as rf
from conftest import REPO, load_yaml
from gridbench.aggregate import k_sweep
from gridbench.aggregate.analysis import Measure
from gridbench.aggregate.checks import machines_differ
from gridbench.aggregate.k_sweep import KChoice, KFamily
from gridbench.aggregate.records import ConfigIdentity
from gridbench.aggregate.report import render_report
from gridbench.aggregate.report.k_sweep import k_sweep_section, k_sweep_verdict_lines
from gridbench.config.loading import load_grid, load_grid_json

DRAFT = {"method": "dflash", "draft_model": "/models/DFlash"}
# (prompt class, concurrency) -> output tok/s of k = 1, 4, 15 and the baseline; None: failed.
# k = 4 wins at c = 1 and 4, k = 1 at c = 16.
NATURAL = {
    ("code", 1): (100.0, 120.0, 110.0, 80.0),
    ("code", 4): (250.0, 300.0, 260.0, 200.0),
    ("code", 16): (400.0, 380.0, 300.0, 320.0),
    ("prose", 1): (50.0, 66.0, 60.0, 40.0),
    ("prose", 4): (120.0, 150.0, 125.0, 100.0),
    ("prose", 16): (200.0, 170.0, None, 160.0),
}
# depth -> decode (mean, std) of k = 1, 4, 15 and the baseline
DEPTHS = {
    0: ((60.0, 1.0), (75.0, 1.5), (70.0, 1.0), (40.0, 0.5)),
    32768: ((30.0, 0.6), (27.0, 0.5), (20.0, 0.4), (25.0, 0.5)),
}
SWEEP = ("Q_k1", "Q_k4", "Q_k15")


def config_document(**speculations) -> dict:
    """Seed 000's grid with these speculations, each served on nvfp4 as its own config
    (Q_<name>), and nvfp4 without speculation (Q_plain)."""
    config = copy.deepcopy(load_yaml(rf.FIXTURES / "seed000.yaml"))
    del config["study"]["baseline"]
    config["speculations"] = {"none": {"method": "none"}, **speculations}
    config["configs"] = {
        "Q_plain": {"engine": "aeon", "checkpoint": "nvfp4", "speculation": "none"},
        **{
            f"Q_{name}": {"engine": "aeon", "checkpoint": "nvfp4", "speculation": name}
            for name in speculations
        },
    }
    return config


def sweep_grid(**more):
    return load_grid(
        config_document(
            k1={**DRAFT, "num_speculative_tokens": 1, "label": "DFlash k=1"},
            k4={**DRAFT, "num_speculative_tokens": 4, "label": "DFlash k=4"},
            k15={**DRAFT, "num_speculative_tokens": 15, "label": "DFlash k=15"},
            **more,
        ),
        "k_sweep.yaml",
    )


def identity(grid, config: str) -> dict:
    return asdict(ConfigIdentity.from_config(grid.configs[config]))


def natural_frame(grid, extra=()) -> pd.DataFrame:
    rows = []
    for (prompt_class, concurrency), rates in NATURAL.items():
        for config, rate in [*zip((*SWEEP, "Q_plain"), rates, strict=True), *extra]:
            rows.append(
                {
                    **identity(grid, config),
                    "prompt_class": prompt_class,
                    "concurrency": concurrency,
                    "status": "failed" if rate is None else "ok",
                    "output_tok_s": rate,
                }
            )
    return pd.DataFrame.from_records(rows).astype(object)


def depth_frame(grid) -> pd.DataFrame:
    rows = [
        {
            **identity(grid, config),
            "context_tokens": depth,
            "status": "ok",
            "decode_tps": mean,
            "decode_tps_std": std,
        }
        for depth, measures in DEPTHS.items()
        for config, (mean, std) in zip((*SWEEP, "Q_plain"), measures, strict=True)
    ]
    return pd.DataFrame.from_records(rows).astype(object)


def test_a_family_is_the_configs_that_differ_only_in_k():
    grid = sweep_grid(
        other4={"method": "dflash", "draft_model": "/models/Other", "num_speculative_tokens": 4},
        again4={**DRAFT, "num_speculative_tokens": 4, "label": "DFlash again"},
        alone8={"method": "dflash", "draft_model": "/models/Alone", "num_speculative_tokens": 8},
    )
    (family,) = k_sweep.families(grid.configs)
    # another draft is no member, nor is a second config at a k the family has
    assert family == KFamily(SWEEP, (1, 4, 15))
    assert (family.default_k, family.config_of(4)) == (15, "Q_k4")


def test_served_differently_is_no_family():
    config = config_document(
        k1={**DRAFT, "num_speculative_tokens": 1},
        k4={**DRAFT, "num_speculative_tokens": 4},
    )
    config["configs"]["Q_k4"]["extra_args"] = ["--max-num-seqs", "8"]
    assert k_sweep.families(load_grid(config, "k_sweep.yaml").configs) == []


def test_the_best_k_is_the_fastest_and_the_smaller_on_a_tie():
    choice = KChoice({1: Measure(10.0), 4: Measure(12.0), 15: Measure(12.0)}, 15, Measure(8.0))
    assert choice.best_k == 4
    assert choice.over_default == Measure(1.0)
    assert choice.over_baseline == Measure(1.5)
    # one measured k is no choice; a failed default leaves the best without its ratio
    assert k_sweep.choice({1: Measure(5.0), 4: None, 15: None}, 15, None) is None
    assert k_sweep.choice({1: Measure(5.0), 4: Measure(6.0), 15: None}, 15, None).over_default is None


def test_the_best_k_by_class_and_concurrency_against_the_default_and_the_baseline():
    grid = sweep_grid()
    (sweep,) = k_sweep.sweeps(grid, depth_frame(grid), natural_frame(grid))
    assert sweep.baseline == "Q_plain"
    best = {(c.prompt_class, c.concurrency): c.choice.best_k for c in sweep.by_class}
    assert best == {
        ("code", 1): 4,
        ("code", 4): 4,
        ("code", 16): 1,
        ("prose", 1): 4,
        ("prose", 4): 4,
        ("prose", 16): 1,
    }
    code16 = next(c.choice for c in sweep.by_class if (c.prompt_class, c.concurrency) == ("code", 16))
    assert code16.over_default.mean == pytest.approx(400 / 300)
    assert code16.over_baseline.mean == pytest.approx(400 / 320)
    summary = k_sweep.summarize(k_sweep.class_points(sweep))
    assert (summary.k, summary.wins, summary.points, dict(summary.others)) == (4, 4, 6, {1: 2})
    # prose c=16 has no k = 15: c=16's ratio is code's alone
    expected = ((1, 120 / 110, 66 / 60), (4, 300 / 260, 150 / 125), (16, 380 / 300, 380 / 300))
    assert [pytest.approx(point) for point in expected] == list(summary.against_default)
    assert [(d.depth, d.choice.best_k) for d in sweep.by_depth] == [(0, 4), (32768, 1)]


def test_the_section_says_which_k_is_best_where():
    grid = sweep_grid()
    section = k_sweep_section(grid, depth_frame(grid), natural_frame(grid))
    assert section.startswith("## Draft length k\n\n")
    assert "### DFlash on nvfp4 (AEON-7 vllm-spark-omni-q36 v1.2): k = 1, 4 and 15" in section
    assert (
        "| class | c | best k | its agg tok/s | × over k = 15 | × over `Q_plain` "
        "| agg tok/s at k = 1 / 4 / 15 |\n"
        "|---|---|---|---|---|---|---|\n"
        "| code | 1 | 4 | 120 | 1.09× | 1.50× | 100 / 120 / 110 |\n"
        "| code | 4 | 4 | 300 | 1.15× | 1.50× | 250 / 300 / 260 |\n"
        "| code | 16 | 1 | 400 | 1.33× | 1.25× | 400 / 380 / 300 |\n"
        "| prose | 1 | 4 | 66.0 | 1.10× | 1.65× | 50.0 / 66.0 / 60.0 |\n"
        "| prose | 4 | 4 | 150 | 1.20× | 1.50× | 120 / 150 / 125 |\n"
        "| prose | 16 | 1 | 200 | — | 1.25× | 200 / 170 / — |\n"
    ) in section
    assert (
        "k = 4 is best in 4 of 6 class/concurrency cells (elsewhere k = 1 in 2); against the default "
        "k = 15 it gives 1.09–1.10× at c = 1 and 1.27× at c = 16."
    ) in section
    assert "| 0 | 4 | 75.0 ± 1.5 | 1.07 ± 0.03× | 1.88 ± 0.04× | 60.0 / 75.0 / 70.0 |" in section
    assert "| 32768 | 1 | 30.0 ± 0.6 | 1.50 ± 0.04× | 1.20 ± 0.03× | 30.0 / 27.0 / 20.0 |" in section
    assert "On the depth sweep, k = 1 is best in 1 of 2 depths (elsewhere k = 4 in 1)" in section
    (line,) = k_sweep_verdict_lines(grid, depth_frame(grid), natural_frame(grid))
    assert line.startswith(
        "Draft length: DFlash on nvfp4 (AEON-7 vllm-spark-omni-q36 v1.2) is fastest at k = 4 in 4 of 6 "
        "class/concurrency cells (k = 1, 4 and 15 measured; see [Draft length k](#draft-length-k))."
    )


def test_another_draft_at_one_k_changes_nothing():
    grid = sweep_grid(
        other4={"method": "dflash", "draft_model": "/models/Other", "num_speculative_tokens": 4}
    )
    natural = natural_frame(grid, extra=[("Q_other4", 999.0)])
    assert k_sweep_section(grid, depth_frame(grid), natural) == k_sweep_section(
        grid, depth_frame(grid), natural_frame(grid)
    )


def test_without_a_family_there_is_no_section():
    grid = load_grid(
        config_document(
            k4={**DRAFT, "num_speculative_tokens": 4},
            k8={**DRAFT, "draft_model": "/b", "num_speculative_tokens": 8},
        ),
        "k_sweep.yaml",
    )
    assert k_sweep.families(grid.configs) == []
    assert k_sweep_section(grid, pd.DataFrame(), None) == ""
    same_grid, plan, results, failures = rf.same_weights()
    report = render_report(same_grid, rf.depth_frame(plan, results, failures))
    assert "Draft length" not in report


def test_the_h100_studys_sweep_finds_a_short_k_faster_than_the_default_everywhere():
    """studies/h100-speculation (the trained EAGLE-3 head at k = 1, 2, 4, 8 and 15 on an H100):
    seed 000's finding that a short k beats the default k = 15, on real weights."""
    study = REPO / "studies/h100-speculation"
    dataset = pd.read_csv(study / "dataset/dataset.csv")
    natural = pd.read_csv(study / "dataset/natural.csv")
    (sweep,) = k_sweep.sweeps(load_grid_json(study / "grid.json"), dataset, natural)
    assert sweep.family.ks == (1, 2, 4, 8, 15) and sweep.baseline == "R_none"
    points = k_sweep.class_points(sweep)
    assert len(points) == 12 and all(c.best_k != 15 for _, c in points)
    assert all(c.tok_s[c.best_k].mean > 1.3 * c.tok_s[15].mean for _, c in points)
    summary = k_sweep.summarize(points)
    assert (summary.k, summary.wins, dict(summary.others)) == (1, 8, {2: 2, 4: 1, 8: 1})


def test_the_h100_studys_report_says_its_k_family_ran_on_two_machines():
    """Loan 6's H100 measured plain decoding and k = 1, 4, 15, loan 7's k = 2, 8 and ngram: the
    report's check names each machine's configs, as a third machine read 0.42-0.78x."""
    study = REPO / "studies/h100-speculation"
    dataset = pd.read_csv(study / "dataset/dataset.csv")
    natural = pd.read_csv(study / "dataset/natural.csv")
    check = machines_differ(dataset, natural)
    assert check.findings == (
        "R_none, R_e3_k4, R_e3_k15 and R_e3_k1 on GPU-c41da9f0",
        "R_e3_k8, R_e3_k2 and R_ngram4 on GPU-e9484e34",
    )
    assert "configs measured on different machines" in (study / "dataset/comparison.md").read_text()
