"""The graphs: every one is drawn (with a "no data" note when there is nothing to show),
every config is in it with its label, and the depth graphs carry the runs' spread."""

from __future__ import annotations

import re

import pandas as pd
import pytest
from matplotlib.container import ErrorbarContainer

import report_fixtures as rf
from conftest import REPO
from gridbench import layout
from gridbench.aggregate import plots

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def seed002():
    grid, plan, results, failures = rf.seed002()
    return grid, rf.depth_frame(plan, results, failures)


@pytest.fixture(scope="module")
def seed000_natural():
    _, _, _, _, nplan, nresults, nfailures = rf.seed000()
    return rf.natural_frame(nplan, nresults, nfailures)


def texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def legend_labels(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]


def test_every_depth_graph_is_written_as_png(seed002, tmp_path):
    grid, frame = seed002
    paths = plots.save(plots.depth_figures(frame, grid.study), tmp_path)
    assert [p.name for p in paths] == [f"{name}.png" for name in layout.DEPTH_GRAPHS]
    for path in paths:
        data = path.read_bytes()
        assert data.startswith(PNG) and len(data) > 20_000


def test_line_graphs_plot_every_config_with_error_bars(seed002):
    _grid, frame = seed002
    fig = plots.line_vs_context(frame, plots.LINE_GRAPHS["decode_vs_context"])
    labels = legend_labels(fig)
    assert [label.split(":")[0] for label in labels] == list(dict.fromkeys(frame["config"]))
    assert "Q_nvfp4_dfl8: NVFP4 · aeon 0.23 · DSpark-DFlash" in labels[-1]
    (ax,) = fig.axes
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 9 and all(c.has_yerr for c in bars)
    assert ax.get_xlabel() == "context depth (tokens)"
    assert [t.get_text() for t in ax.get_xticklabels()][-3:] == ["32k", "48k", "64k"]
    ttft = plots.line_vs_context(frame, plots.LINE_GRAPHS["ttft_vs_context"])
    assert ttft.axes[0].get_yscale() == "log"


def test_grouped_bars_at_the_standard_depths(seed002):
    _grid, frame = seed002
    fig = plots.grouped_bars(frame, plots.GROUPED_GRAPHS["decode_grouped"])
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["0", "8k", "16k", "32k"]
    assert [t.get_text() for t in ax.get_xticklabels()] == list(dict.fromkeys(frame["config"]))


def test_speedup_marks_each_crossover(seed002):
    grid, frame = seed002
    fig = plots.speedup_vs_context(frame, grid.study)
    assert legend_labels(fig) == [
        "Q_bf16_dfl1 over Q_bf16_aeon_n0",
        "Q_bf16_dfl8 over Q_bf16_aeon_n0",
        "Q_nvfp4_dfl8 over Q_nvfp4_aeon_n0",
    ]
    spans = [p for p in fig.axes[0].patches if p.get_x() == 8192]
    assert len(spans) == 3  # each shaded from 8192 to 12288


def test_acceptance_per_position_has_one_line_per_speculative_config(seed002):
    _grid, frame = seed002
    fig = plots.acceptance_per_position(frame)
    left = fig.axes[0]
    assert [line.get_label() for line in left.get_lines()] == ["Q_bf16_dfl1", "Q_bf16_dfl8", "Q_nvfp4_dfl8"]
    assert len(left.get_lines()[-1].get_xdata()) == 8


def test_graphs_without_data_say_so(seed002, tmp_path):
    grid, frame = seed002
    nothing = frame.assign(status="failed")
    for name, draw in plots.depth_figures(nothing, grid.study).items():
        assert any(t.startswith("no data:") for t in texts(draw())), name
    plain = frame[frame["speculation_method"] == "none"]
    fig = plots.acceptance_per_position(plain)
    assert texts(fig) == ["no data: no speculative config in the grid"] * 2
    llama = frame.assign(acceptance_per_position=pd.NA)
    assert "no data: the engine reports no per-position counters" in texts(
        plots.acceptance_per_position(llama)
    )
    assert len(plots.save(plots.depth_figures(nothing, grid.study), tmp_path)) == len(layout.DEPTH_GRAPHS)


def test_natural_graphs_have_a_panel_per_class(seed000_natural, tmp_path):
    paths = plots.save(plots.natural_figures(seed000_natural), tmp_path)
    assert [p.name for p in paths] == [f"{name}.png" for name in layout.NATURAL_GRAPHS]
    fig = plots.natural_vs_concurrency(seed000_natural, plots.NATURAL["natural_ttft_vs_concurrency"])
    assert [ax.get_title() for ax in fig.axes] == ["code", "reasoning", "dialogue", "prose"]
    code = fig.axes[0]
    assert len(code.get_lines()) == 6  # p50 and dotted p95 for each of 3 configs
    assert list(code.get_lines()[2].get_ydata()) == [557.0, 796.0, 883.0, 1654.0]
    prose_fp8 = fig.axes[3].get_lines()[0]
    assert list(prose_fp8.get_xdata()) == [1, 4, 8]  # the failed c=16 level is left out
    empty = seed000_natural.assign(status="failed")
    assert (
        texts(plots.natural_vs_concurrency(empty, plots.NATURAL["natural_tok_s_vs_concurrency"]))
        == ["no data: no measured cell"] * 4
    )


def test_the_workflow_declares_exactly_the_graphs_drawn():
    rules = (REPO / "workflow/rules/report.smk").read_text()
    declared = re.findall(r'"graphs/(\w+)\.png"', rules)
    assert declared == [
        *layout.DEPTH_GRAPHS,
        *layout.NATURAL_GRAPHS,
        *layout.QUALITY_GRAPHS,
        *layout.LOAD_GRAPHS,
        *layout.SESSION_GRAPHS,
    ]
    assert list(plots.LINE_GRAPHS) + list(plots.GROUPED_GRAPHS) == list(layout.DEPTH_GRAPHS[:5])
    assert list(plots.natural_figures(pd.DataFrame())) == list(layout.NATURAL_GRAPHS)
    assert list(plots.quality_figures(pd.DataFrame(), pd.DataFrame())) == list(layout.QUALITY_GRAPHS)
    assert list(plots.load_figures(pd.DataFrame())) == list(layout.LOAD_GRAPHS)
    assert list(plots.session_figures(pd.DataFrame())) == list(layout.SESSION_GRAPHS)


CONFIGS = {
    "A": {"config_label": "plain", "speculation_method": "none"},
    "B": {"config_label": "ngram", "speculation_method": "ngram"},
}


def load_rows(status: str = "ok") -> pd.DataFrame:
    rows = []
    for config, share_at in (("A", {2: 1.0, 8: 0.95, 32: 0.2}), ("B", {2: 1.0, 8: 0.5, 32: 0.0})):
        for rate, share in share_at.items():
            rows.append(
                {
                    "config": config,
                    **CONFIGS[config],
                    "prompt_class": "code",
                    "arrival": "poisson",
                    "rate_req_s": float(rate),
                    "status": status,
                    "slo_attainment_share": share,
                    "slo_attainment_required": 0.9,
                    "goodput_tok_s": 100.0 * rate * share,
                    "saturated": rate == 32,
                }
            )
    return pd.DataFrame(rows)


def test_the_load_graph_draws_attainment_and_goodput_by_rate_with_the_target_and_saturation(tmp_path):
    paths = plots.save(plots.load_figures(load_rows()), tmp_path)
    assert [p.name for p in paths] == ["load_slo_vs_rate.png"]
    attainment, goodput = plots.load_slo_vs_rate(load_rows()).axes[:2]
    assert attainment.get_title() == "code, poisson arrivals"
    lines = attainment.get_lines()
    assert list(lines[0].get_xdata()) == [2, 8, 32] and list(lines[0].get_ydata()) == [100, 95, 20]
    assert list(lines[1].get_ydata()) == [100, 50, 0]
    assert list(lines[-1].get_ydata()) == [90, 90]  # the required attainment
    # each config's goodput, then each one's saturated level crossed
    assert [list(line.get_ydata()) for line in goodput.get_lines()] == [
        [200.0, 760.0, 640.0],
        [200.0, 400.0, 0.0],
        [640.0],
        [0.0],
    ]
    assert [line.get_marker() for line in goodput.get_lines()[2:]] == ["x", "x"]
    assert texts(plots.load_slo_vs_rate(load_rows("failed"))) == ["no data: no measured cell"] * 2


def session_rows(status: str = "ok") -> pd.DataFrame:
    rows = []
    for config, ttft in (("A", [200.0, 90.0, 100.0]), ("B", [210.0, 300.0, 420.0])):
        for turn, ttft_ms in enumerate(ttft, start=1):
            cached = None if config == "B" and turn == 2 else (0.0 if turn == 1 else 0.8)
            rows.append(
                {
                    "config": config,
                    **CONFIGS[config],
                    "prompt_class": "dialogue",
                    "sessions": 4,
                    "turn": turn,
                    "status": status,
                    "ttft_ms_p50": ttft_ms,
                    "cached_prompt_share": cached,
                }
            )
    return pd.DataFrame(rows)


def test_the_session_graph_draws_ttft_and_the_cached_share_by_turn_leaving_a_missing_count_out(tmp_path):
    paths = plots.save(plots.session_figures(session_rows()), tmp_path)
    assert [p.name for p in paths] == ["session_ttft_by_turn.png"]
    ttft, cached = plots.session_ttft_by_turn(session_rows()).axes[:2]
    assert ttft.get_title() == "dialogue, 4 at once"
    assert [list(line.get_ydata()) for line in ttft.get_lines()] == [[200, 90, 100], [210, 300, 420]]
    shares = [line.get_ydata().tolist() for line in cached.get_lines()]
    assert shares[0] == [0, 80, 80]
    assert shares[1][0] == 0 and pd.isna(shares[1][1]) and shares[1][2] == 80  # a gap, not a zero
    assert texts(plots.session_ttft_by_turn(session_rows("failed"))) == ["no data: no measured cell"] * 2


def test_the_pareto_graph_draws_each_config_and_names_the_frontier(seed000_natural):
    fig = plots.pareto_frontier(seed000_natural)
    assert [ax.get_title() for ax in fig.axes] == ["code", "reasoning", "dialogue", "prose"]
    code = fig.axes[0]
    frontier = next(line for line in code.get_lines() if line.get_label() == "frontier")
    assert list(frontier.get_xdata()) == sorted(frontier.get_xdata())  # most throughput to the left
    named = [t.get_text() for t in code.texts]
    assert "Q_nvfp4_dflash_k5 c=16" in named and len(named) == len(frontier.get_xdata())
