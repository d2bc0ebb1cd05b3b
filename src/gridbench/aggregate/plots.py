"""The graphs: PNG files drawn headless (matplotlib's Agg canvas, no pyplot state).

Every graph named in layout's *_GRAPHS tuples is always written; one with nothing
to show says so on the canvas ("no data: ..."), so the workflow's outputs never go missing.
"""

from __future__ import annotations

import functools
import io
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from gridbench import layout
from gridbench.aggregate import analysis
from gridbench.aggregate.quality import speed_quality
from gridbench.config.grid import StudyInfo
from gridbench.util.files import atomic_write_bytes

SIZE = (11, 5.5)
DPI = 120
MARKERS = "osD^vP*Xh<>"


class DepthGraph(NamedTuple):
    column: str
    ylabel: str
    title: str
    log_y: bool


LINE_GRAPHS = {
    "decode_vs_context": DepthGraph(
        "decode_tps", "decode tok/s", "Decode throughput vs context depth", False
    ),
    "ttft_vs_context": DepthGraph(
        "ttft_ms", "TTFT (ms, log scale)", "Time to first token vs context depth", True
    ),
    "prefill_vs_context": DepthGraph(
        "prefill_tps", "prefill tok/s", "Prefill throughput vs context depth", False
    ),
}
GROUPED_GRAPHS = {
    "decode_grouped": DepthGraph(
        "decode_tps", "decode tok/s", "Decode tok/s by config across context depths", False
    ),
    "ttft_grouped": DepthGraph(
        "ttft_ms", "TTFT (ms, log scale)", "TTFT by config across context depths", True
    ),
}


class NaturalGraph(NamedTuple):
    column: str
    tail_column: str | None  # drawn dotted beside the median
    ylabel: str
    title: str


NATURAL = {
    "natural_tok_s_vs_concurrency": NaturalGraph(
        "output_tok_s", None, "aggregate output tok/s", "Natural prompts: aggregate throughput vs concurrency"
    ),
    "natural_ttft_vs_concurrency": NaturalGraph(
        "ttft_ms_p50", "ttft_ms_p95", "TTFT (ms)", "Natural prompts: TTFT p50 (dotted: p95) vs concurrency"
    ),
    "natural_tpot_vs_concurrency": NaturalGraph(
        "tpot_ms_p50", "tpot_ms_p95", "TPOT (ms)", "Natural prompts: TPOT p50 (dotted: p95) vs concurrency"
    ),
}


# --- styling ----------------------------------------------------------------------------


class Style(NamedTuple):
    color: Any
    marker: str
    linestyle: str
    label: str


def config_styles(frame: pd.DataFrame) -> dict[str, Style]:
    """One colour and marker per config, in config order; speculative configs dashed."""
    from matplotlib import colormaps

    meta = frame.drop_duplicates("config")
    cmap = colormaps["tab10" if len(meta) <= 10 else "tab20"]
    styles = {}
    for i, row in enumerate(meta.itertuples()):
        label = f"{row.config}: {row.config_label}"
        styles[row.config] = Style(
            cmap(i % cmap.N),
            MARKERS[i % len(MARKERS)],
            "-" if row.speculation_method == "none" else "--",
            "\n".join(textwrap.wrap(label, 48, subsequent_indent="  ")),
        )
    return styles


def _depth_axis(ax: Axes, depths: list[int]) -> None:
    positive = [d for d in depths if d > 0]
    if positive:
        ax.set_xscale("symlog", linthresh=min(positive), linscale=0.6)
        ax.set_xlim(-0.15 * min(positive), max(positive) * 1.15)  # no empty negative half
    ax.set_xticks(depths)
    ax.set_xticklabels(
        [analysis.short_depth(d) for d in depths], fontsize=8, rotation=45 if len(depths) > 8 else 0
    )
    ax.minorticks_off()
    ax.set_xlabel("context depth (tokens)")


def _legend(ax: Axes) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def _no_data(ax: Axes, why: str) -> None:
    ax.text(0.5, 0.5, f"no data: {why}", ha="center", va="center", transform=ax.transAxes, fontsize=12)
    ax.set_xticks([])
    ax.set_yticks([])


def _figure(
    title: str, ncols: int = 1, nrows: int = 1, size: tuple[float, float] = SIZE
) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=size, dpi=DPI, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    fig.suptitle(title)
    for ax in axes:
        ax.grid(alpha=0.3)
    return fig, axes


def _bars_not_below_zero(err: pd.Series, values: pd.Series, log: bool) -> pd.Series | list[pd.Series]:
    """Error bars clipped at the axis floor on a log scale (a bar below 0 cannot be drawn)."""
    if not log:
        return err
    return [err.clip(upper=values * 0.999), err]


# --- depth graphs -----------------------------------------------------------------------


def line_vs_context(frame: pd.DataFrame, spec: DepthGraph) -> Figure:
    fig, (ax,) = _figure(spec.title)
    ok = analysis.measured(frame).dropna(subset=[spec.column])
    if ok.empty:
        _no_data(ax, f"no measured cell has {spec.column}")
        return fig
    styles = config_styles(frame)
    for config in analysis.config_order(frame):
        rows = ok[ok["config"] == config].sort_values("context_tokens")
        if rows.empty:
            continue
        style = styles[config]
        values = rows[spec.column].astype(float)
        err = rows[f"{spec.column}_std"].astype(float).fillna(0.0)
        ax.errorbar(
            rows["context_tokens"].astype(int),
            values,
            yerr=_bars_not_below_zero(err, values, spec.log_y),
            color=style.color,
            marker=style.marker,
            linestyle=style.linestyle,
            markersize=4,
            capsize=3,
            label=style.label,
        )
    if spec.log_y:
        _log_axis(ax)
    _depth_axis(ax, sorted(int(d) for d in ok["context_tokens"].unique()))
    ax.set_ylabel(spec.ylabel)
    _legend(ax)
    return fig


def grouped_bars(frame: pd.DataFrame, spec: DepthGraph) -> Figure:
    fig, (ax,) = _figure(spec.title)
    ok = analysis.measured(frame).dropna(subset=[spec.column])
    depths = analysis.pick_depths(ok["context_tokens"].astype(int), analysis.GROUPED_DEPTHS, 4)
    if ok.empty or not depths:
        _no_data(ax, f"no measured cell has {spec.column}")
        return fig
    configs = analysis.config_order(frame)
    cells = analysis.cell_index(ok)
    width = 0.8 / len(depths)
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    for j, depth in enumerate(depths):
        xs, values, errs = [], [], []
        for i, config in enumerate(configs):
            point = analysis.measure_at(cells, config, depth, spec.column)
            if point is not None:
                xs.append(i - 0.4 + width * (j + 0.5))
                values.append(point.mean)
                errs.append(point.std)
        if not xs:
            continue
        values_s, errs_s = pd.Series(values), pd.Series(errs)
        bars = ax.bar(
            xs,
            values,
            width,
            yerr=_bars_not_below_zero(errs_s, values_s, spec.log_y),
            capsize=2,
            color=cmap(j / max(1, len(depths) - 1) * 0.85),
            label=analysis.short_depth(depth),
        )
        ax.bar_label(bars, labels=[_short_number(v) for v in values], fontsize=6, padding=2)
    if spec.log_y:
        _log_axis(ax)
    ax.set_xticks(range(len(configs)))
    ax.set_xticklabels(configs, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(spec.ylabel)
    ax.legend(title="context depth", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return fig


def ttft_cached_vs_context(frame: pd.DataFrame) -> Figure:
    """Per config of the prefix-cache pass: the cold TTFT (dashed) and the TTFT over a cached
    context (solid) at each depth. A failed cell breaks its line and is marked ✕ on the
    depth axis, so no line bridges it."""
    fig, (ax,) = _figure(layout.GRAPH_TITLES["ttft_cached_vs_context"])
    rows = analysis.with_cached(frame)
    if rows.empty:
        _no_data(ax, "no config has the prefix-cache pass (benchy.prefix_cache_pass)")
        return fig
    styles = config_styles(frame)
    failed_marked = False
    values: list[float] = []
    for config in analysis.config_order(rows):
        mine = rows[rows["config"] == config].sort_values("context_tokens")
        depths = mine["context_tokens"].astype(int)
        style = styles[config]
        for column, status, kind, linestyle, marker in (
            ("ttft_ms", "status", "cold", "--", "o"),
            ("ttft_ms_cached", "cached_status", "cached", "-", "s"),
        ):
            ok = (mine[status] == "ok").to_numpy(dtype=bool)
            ys = mine[column].astype(float).where(ok)  # NaN breaks the line at a failed cell
            values += ys.dropna().tolist()
            ax.plot(
                depths,
                ys,
                color=style.color,
                linestyle=linestyle,
                marker=marker,
                markersize=4,
                label=f"{config} {kind}",
            )
            failed = depths[~ok]
            if len(failed):
                ax.plot(
                    failed,
                    [0.03] * len(failed),
                    linestyle="none",
                    marker="x",
                    markersize=8,
                    color=style.color,
                    transform=ax.get_xaxis_transform(),  # x in depths, y at the axis's foot
                    label=None if failed_marked else "✕ failed cell (no value)",
                )
                failed_marked = True
    if values:
        _log_axis(ax)
    depths = sorted(int(d) for d in rows["context_tokens"].unique())
    _depth_axis(ax, depths)
    ax.set_xlim(depths[0] / 1.3, depths[-1] * 1.3)  # every depth is above 0: no linear stretch by 0
    ax.set_ylabel("TTFT (ms, log scale; dashed: cold, solid: cached context)")
    _legend(ax)
    return fig


def _short_number(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 10 else f"{value:.1f}"


def _log_ratio_axis(ax: Axes, ratios: list[float]) -> None:
    """Log scale (2x and 0.5x lie equally far from 1) with plain-number ticks, framing the
    measured ratios and 1; error bars that reach further are cut at the frame."""
    low, high = min(min(ratios) / 1.3, 0.9), max(max(ratios) * 1.3, 1.1)
    _log_axis(ax, (1.0, 2.0, 5.0) if high / low > 20 else (1.0, 1.5, 2.0, 3.0, 5.0, 7.0))
    ax.set_ylim(low, high)


def _log_axis(ax: Axes, subs: tuple[float, ...] = (1.0, 2.0, 5.0)) -> None:
    """Log y with plain-number ticks (200, 500, 1000) rather than powers of ten alone."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def speedup_vs_context(frame: pd.DataFrame, study: StudyInfo) -> Figure:
    fig, (ax,) = _figure("Decode speedup over each config's baseline vs context depth")
    series = [s for s in analysis.speedups(frame, study) if s.points]
    if not series:
        _no_data(ax, "no config has a baseline measured at the same depths (study.baseline)")
        return fig
    styles = config_styles(frame)
    depths: set[int] = set()
    for s in series:
        style = styles[s.config]
        xs = [p.depth for p in s.points]
        depths.update(xs)
        means = pd.Series([p.speedup.mean for p in s.points])
        ax.errorbar(
            xs,
            means,
            yerr=_bars_not_below_zero(pd.Series([p.speedup.std for p in s.points]), means, log=True),
            color=style.color,
            marker=style.marker,
            linestyle=style.linestyle,
            markersize=4,
            capsize=3,
            label=f"{s.config} over {s.baseline}",
        )
        if s.crossover:
            ax.axvspan(*s.crossover, color=style.color, alpha=0.08)
    ax.axhline(1.0, color="black", linewidth=1)
    _log_ratio_axis(ax, [p.speedup.mean for s in series for p in s.points])
    _depth_axis(ax, sorted(depths))
    ax.set_ylabel("decode speedup (×, config ÷ baseline, log scale)")
    ax.text(
        0.01, 0.01, "shaded: where a config stops beating its baseline", transform=ax.transAxes, fontsize=7
    )
    _legend(ax)
    return fig


def acceptance_per_position(frame: pd.DataFrame) -> Figure:
    fig, (left, right) = _figure("Speculative decoding: acceptance", ncols=2, size=(13, 5.5))
    left.set_title("per draft position, all measured cells", fontsize=10)
    right.set_title("acceptance rate vs context depth", fontsize=10)
    spec = frame[frame["speculation_method"] != "none"]
    if spec.empty:
        _no_data(left, "no speculative config in the grid")
        _no_data(right, "no speculative config in the grid")
        return fig
    styles = config_styles(frame)
    by_position = analysis.acceptance_by_position(frame)
    lacking = [c for c, rates in by_position.items() if rates is None]
    for config, rates in by_position.items():
        if rates:
            style = styles[config]
            left.plot(range(len(rates)), rates, color=style.color, marker=style.marker, label=config)
    if len(lacking) == len(by_position):
        _no_data(left, "the engine reports no per-position counters")
    else:
        left.set_xlabel("draft position")
        left.xaxis.set_major_locator(MaxNLocator(integer=True))
        left.set_ylabel("accepted per draft")
        left.set_ylim(0, 1.05)
        left.legend(fontsize=7.5, frameon=False)
        if lacking:
            left.text(
                0.01,
                0.01,
                "no per-position data: " + ", ".join(lacking),
                transform=left.transAxes,
                fontsize=7,
            )
    ok = analysis.measured(spec).dropna(subset=["acceptance_rate"])
    if ok.empty:
        _no_data(right, "no measured cell has acceptance counters")
        return fig
    for config in analysis.config_order(ok):
        rows = ok[ok["config"] == config].sort_values("context_tokens")
        style = styles[config]
        right.plot(
            rows["context_tokens"].astype(int),
            rows["acceptance_rate"].astype(float),
            color=style.color,
            marker=style.marker,
            linestyle=style.linestyle,
            label=style.label,
        )
    _depth_axis(right, sorted(int(d) for d in ok["context_tokens"].unique()))
    right.set_ylabel("accepted ÷ drafted tokens")
    right.set_ylim(0, 1.05)
    _legend(right)
    return fig


# --- natural graphs ---------------------------------------------------------------------


def natural_vs_concurrency(natural: pd.DataFrame, spec: NaturalGraph) -> Figure:
    classes = list(dict.fromkeys(natural["prompt_class"])) or ["(none)"]
    ncols = min(2, len(classes))
    nrows = (len(classes) + ncols - 1) // ncols
    fig, axes = _figure(spec.title, ncols=ncols, nrows=nrows, size=(12, 3.2 * nrows + 1.3))
    for ax in axes[len(classes) :]:
        ax.set_visible(False)
    ok = natural[natural["status"] == "ok"].dropna(subset=[spec.column])
    styles = config_styles(natural) if not natural.empty else {}
    levels = sorted(int(c) for c in natural["concurrency"].dropna().unique())
    for ax, prompt_class in zip(axes, classes, strict=False):
        ax.set_title(prompt_class, fontsize=10)
        rows = ok[ok["prompt_class"] == prompt_class]
        if rows.empty:
            _no_data(ax, "no measured cell")
            continue
        for config in analysis.config_order(natural):
            mine = rows[rows["config"] == config].sort_values("concurrency")
            if mine.empty:
                continue
            style = styles[config]
            x = mine["concurrency"].astype(int)
            ax.plot(
                x, mine[spec.column].astype(float), color=style.color, marker=style.marker, label=style.label
            )
            if spec.tail_column:
                ax.plot(
                    x, mine[spec.tail_column].astype(float), color=style.color, linestyle=":", linewidth=1
                )
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels)
        ax.set_xticklabels([str(c) for c in levels])
        ax.minorticks_off()
        ax.set_xlabel("concurrency")
        ax.set_ylabel(spec.ylabel)
    handles, labels = next(
        (ax.get_legend_handles_labels() for ax in axes if ax.get_legend_handles_labels()[0]), ([], [])
    )
    if handles:
        fig.legend(handles, labels, fontsize=7.5, loc="outside lower center", ncols=2, frameon=False)
    return fig


def pareto_frontier(natural: pd.DataFrame) -> Figure:
    """Per prompt class: every level's throughput per GPU against its per-user speed, each
    config's levels joined in concurrency order, the frontier drawn and its levels named."""
    points = analysis.pareto_points(natural, {})
    classes = list(dict.fromkeys(p.prompt_class for p in points)) or ["(none)"]
    ncols = min(2, len(classes))
    nrows = (len(classes) + ncols - 1) // ncols
    fig, axes = _figure(
        layout.GRAPH_TITLES["natural_pareto"], ncols=ncols, nrows=nrows, size=(12, 4.2 * nrows + 1.3)
    )
    for ax in axes[len(classes) :]:
        ax.set_visible(False)
    styles = config_styles(natural) if not natural.empty else {}
    for ax, prompt_class in zip(axes, classes, strict=False):
        ax.set_title(prompt_class, fontsize=10)
        mine = [p for p in points if p.prompt_class == prompt_class]
        if not mine:
            _no_data(ax, "no measured cell")
            continue
        for config in analysis.config_order(natural):
            levels = sorted((p for p in mine if p.config == config), key=lambda p: p.concurrency)
            if levels:
                style = styles[config]
                ax.plot(
                    [p.per_user_tok_s for p in levels],
                    [p.tok_s_per_gpu for p in levels],
                    color=style.color,
                    marker=style.marker,
                    linestyle=":",
                    linewidth=1,
                    label=style.label,
                )
        frontier = sorted((p for p in mine if p.on_frontier), key=lambda p: p.per_user_tok_s)
        ax.plot(
            [p.per_user_tok_s for p in frontier],
            [p.tok_s_per_gpu for p in frontier],
            color="black",
            linewidth=1.5,
            drawstyle="steps-pre",  # the staircase under the points: what some level beats
            label="frontier",
        )
        for p in frontier:
            ax.annotate(
                f"{p.config} c={p.concurrency}",
                (p.per_user_tok_s, p.tok_s_per_gpu),
                fontsize=7,
                xytext=(4, 4),
                textcoords="offset points",
            )
        ax.set_xlabel("per-user output tok/s (p50)")
        ax.set_ylabel("aggregate output tok/s per GPU")
    _legend(axes[0])
    return fig


# --- the quality graph ------------------------------------------------------------------


def quality_frontier(quality: pd.DataFrame, depth: pd.DataFrame) -> Figure:
    """Each config's matching positions against its reference over its decode speed-up over
    that reference, the speed–quality frontier drawn through the configs no other beats on both."""
    fig, (ax,) = _figure(layout.GRAPH_TITLES["quality_frontier"])
    placed = [(p, p.speedup) for p in speed_quality(quality, depth) if p.speedup is not None]
    if not placed:
        _no_data(ax, "no config has quality results and a decode speed at a depth its reference measured")
        return fig
    # the depth graphs' colours, so a config looks the same in every graph
    styles = config_styles(pd.concat([depth, quality]))
    for point, speedup in placed:
        style = styles[point.config]
        xy = (speedup.speedup.mean, point.agreement_pct)
        label = f"{style.label} (vs {point.reference}, depth {speedup.depth})"
        ax.plot(*xy, color=style.color, marker=style.marker, linestyle="none", label=label)
        ax.annotate(point.config, xy, fontsize=7, xytext=(4, 4), textcoords="offset points")
    frontier = sorted((s.speedup.mean, p.agreement_pct) for p, s in placed if p.on_frontier)
    ax.plot(
        [x for x, _ in frontier],
        [y for _, y in frontier],
        color="black",
        linewidth=1.5,
        drawstyle="steps-pre",  # the staircase under the points: what some config beats
        label="frontier",
    )
    ax.axvline(1.0, color="grey", linewidth=0.8)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}×"))
    ax.set_xlabel("decode speed-up over the reference (×)")
    unit = placed[0][0].agreement_unit
    ax.set_ylabel(f"positions matching the reference's greedy output (% of {unit})")
    ax.set_ylim(min(p.agreement_pct for p, _ in placed) - 5, 102)
    _legend(ax)
    return fig


# --- the load and session graphs --------------------------------------------------------


class PanelColumn(NamedTuple):
    upper: Axes
    lower: Axes
    rows: pd.DataFrame  # the column's measured rows


def _two_row_panels(
    frame: pd.DataFrame,
    title: str,
    keys: list[str],
    heading: Callable[..., str],
    x: str,
    upper: Callable[[pd.DataFrame], pd.Series],
    lower: Callable[[pd.DataFrame], pd.Series],
) -> tuple[Figure, list[PanelColumn]]:
    """A column of two panels per distinct value of ``keys`` (in the frame's order): each
    config's ``upper`` and ``lower`` values over ``x`` as one line each, in its style; a column
    without a measured row says so. Returns the figure and the columns that have rows."""
    panels = list(dict.fromkeys(frame[keys].itertuples(index=False, name=None))) or [("(none)",) * len(keys)]
    fig, axes = _figure(title, ncols=len(panels), nrows=2, size=(5.5 * len(panels) + 3, 7.5))
    ok = frame[frame["status"] == "ok"]
    styles = config_styles(frame) if not frame.empty else {}
    columns = []
    for index, values in enumerate(panels):
        column = PanelColumn(axes[index], axes[len(panels) + index], ok)
        for key, value in zip(keys, values, strict=True):
            column = column._replace(rows=column.rows[column.rows[key] == value])
        column.upper.set_title(heading(*values), fontsize=10)
        if column.rows.empty:
            _no_data(column.upper, "no measured cell")
            _no_data(column.lower, "no measured cell")
            continue
        for config in analysis.config_order(frame):
            mine = column.rows[column.rows["config"] == config].sort_values(x)
            if not mine.empty:
                style = styles[config]
                line = {"color": style.color, "marker": style.marker, "linestyle": style.linestyle}
                column.upper.plot(mine[x].astype(float), upper(mine), label=style.label, **line)
                column.lower.plot(mine[x].astype(float), lower(mine), **line)
        columns.append(column)
    _legend(axes[len(panels) - 1])
    return fig, columns


def load_slo_vs_rate(load: pd.DataFrame) -> Figure:
    """Per prompt class and arrival process: each config's SLO attainment (top) and goodput
    (bottom) over the offered rate; the required attainment dashed, a saturated level crossed."""
    fig, columns = _two_row_panels(
        load,
        layout.GRAPH_TITLES["load_slo_vs_rate"],
        ["prompt_class", "arrival"],
        lambda prompt_class, arrival: f"{prompt_class}, {arrival} arrivals",
        "rate_req_s",
        lambda rows: 100 * rows["slo_attainment_share"].astype(float),
        lambda rows: rows["goodput_tok_s"].astype(float),
    )
    styles = config_styles(load) if not load.empty else {}
    for column in columns:
        saturated = column.rows[column.rows["saturated"].astype(bool)]
        for config, mine in saturated.groupby("config", sort=False):
            column.lower.plot(
                mine["rate_req_s"].astype(float),
                mine["goodput_tok_s"].astype(float),
                color=styles[str(config)].color,
                marker="x",
                markersize=11,
                linestyle="none",
            )
        required = column.rows["slo_attainment_required"].dropna()
        if not required.empty:
            column.upper.axhline(100 * float(required.iloc[0]), color="grey", linestyle="--", linewidth=1)
        column.upper.set_ylim(-3, 103)
        column.upper.set_ylabel("requests meeting the SLO (%)")
        column.lower.set_ylabel("goodput (output tok/s)")
        for ax in (column.upper, column.lower):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        column.lower.set_xlabel("offered rate (requests/s; x: saturated)")
    return fig


def session_ttft_by_turn(sessions: pd.DataFrame) -> Figure:
    """Per prompt class and conversation count: each config's TTFT p50 by turn (top) and the
    share of its prompt tokens the engine took from its prefix cache (bottom; None where the
    engine gave no count: a gap in the line, never a zero)."""
    fig, columns = _two_row_panels(
        sessions,
        layout.GRAPH_TITLES["session_ttft_by_turn"],
        ["prompt_class", "sessions"],
        lambda prompt_class, count: f"{prompt_class}, {count} at once",
        "turn",
        lambda rows: rows["ttft_ms_p50"].astype(float),
        lambda rows: 100 * rows["cached_prompt_share"].astype(float),
    )
    turns = sorted(int(t) for t in sessions["turn"].dropna().unique())
    for column in columns:
        column.upper.set_ylabel("TTFT p50 (ms)")
        column.upper.set_ylim(bottom=0)
        column.lower.set_ylabel("prompt tokens from the cache (%)")
        column.lower.set_ylim(-3, 103)
        for ax in (column.upper, column.lower):
            ax.set_xticks(turns)
        column.lower.set_xlabel("turn")
    return fig


# --- writing ----------------------------------------------------------------------------


def depth_figures(frame: pd.DataFrame, study: StudyInfo) -> dict[str, Callable[[], Figure]]:
    figures: dict[str, Callable[[], Figure]] = {}
    for name, spec in LINE_GRAPHS.items():
        figures[name] = functools.partial(line_vs_context, frame, spec)
    for name, grouped in GROUPED_GRAPHS.items():
        figures[name] = functools.partial(grouped_bars, frame, grouped)
    figures["ttft_cached_vs_context"] = lambda: ttft_cached_vs_context(frame)
    figures["speedup_vs_context"] = lambda: speedup_vs_context(frame, study)
    figures["acceptance_per_position"] = lambda: acceptance_per_position(frame)
    return figures


def natural_figures(natural: pd.DataFrame) -> dict[str, Callable[[], Figure]]:
    figures: dict[str, Callable[[], Figure]] = {
        name: functools.partial(natural_vs_concurrency, natural, spec) for name, spec in NATURAL.items()
    }
    figures["natural_pareto"] = lambda: pareto_frontier(natural)
    return figures


def quality_figures(quality: pd.DataFrame, depth: pd.DataFrame) -> dict[str, Callable[[], Figure]]:
    return {"quality_frontier": lambda: quality_frontier(quality, depth)}


def load_figures(load: pd.DataFrame) -> dict[str, Callable[[], Figure]]:
    return {"load_slo_vs_rate": lambda: load_slo_vs_rate(load)}


def session_figures(sessions: pd.DataFrame) -> dict[str, Callable[[], Figure]]:
    return {"session_ttft_by_turn": lambda: session_ttft_by_turn(sessions)}


def save(figures: Mapping[str, Callable[[], Figure]], outdir: Path) -> list[Path]:
    paths = []
    for name, draw in figures.items():
        fig = draw()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", bbox_inches="tight", metadata={"Software": None})
        paths.append(atomic_write_bytes(outdir / f"{name}.png", buffer.getvalue()))
    return paths
