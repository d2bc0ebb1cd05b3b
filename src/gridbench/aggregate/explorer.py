"""The explorer: one self-contained HTML page of interactive graphs over the datasets.

Decode tok/s and TTFT vs depth, speedup over the baseline vs depth, acceptance per draft
position and the natural matrix (tok/s, TTFT, TPOT vs concurrency), each point's hover
showing the cell's measured values, provenance and weights origin. Checkboxes filter the traces
by engine, checkpoint, speculation and weights origin (real, random or undeclared); while a
config on random weights is shown, a note marks its points a mechanism check, in the report's
words. Plotly's JavaScript is inlined, so the page works offline.

``explorer_data`` turns the dataset frames into typed records and ``render_explorer``
turns those into HTML; both are pure. ``write_explorer`` adds plotly's bundle and writes the file.
"""

from __future__ import annotations

import html
import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from gridbench.aggregate import analysis
from gridbench.aggregate.analysis import CellMeasures, Measure, Speedup
from gridbench.aggregate.quality import SpeedQuality, speed_quality
from gridbench.aggregate.records import (
    ConfigIdentity,
    Row,
    integer,
    optional_float,
    optional_int,
    optional_str,
)
from gridbench.aggregate.text import and_list
from gridbench.aggregate.weights_origin import (
    MECHANISM_CHECK,
    RANDOM_WEIGHTS_SHOW,
    is_random,
    origin_kind,
    origin_text,
)
from gridbench.config.grid import StudyInfo, WeightsOrigin
from gridbench.util import codec
from gridbench.util.files import atomic_write_text

# matplotlib's tab10, then tab20b's darker half: the PNG graphs' colours for the first ten
COLORS = (
    *("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"),
    *("#bcbd22", "#17becf", "#393b79", "#ad494a", "#8ca252", "#bd9e39", "#a55194", "#6b6ecf"),
    *("#e7969c", "#637939", "#843c39", "#7b4173"),
)
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "triangle-down", "x", "star", "cross")
# The facets a reader filters by: (trace meta key, heading)
FACETS = (
    ("engine", "engine"),
    ("checkpoint", "checkpoint (quantization)"),
    ("speculation", "speculation"),
    ("origin", "weights"),
)


def _choices(config: ConfigIdentity, origin: WeightsOrigin | None) -> dict[str, tuple[str, str]]:
    """What the filters match a config's traces on: facet -> (value, its label)"""
    return {
        "engine": (config.engine, config.engine_label),
        "checkpoint": (config.checkpoint, f"{config.checkpoint} ({config.quantization})"),
        # engines name the same method differently, and labels may repeat across them
        "speculation": (config.speculation, f"{config.speculation}: {config.speculation_label}"),
        "origin": (origin_kind(origin), origin_kind(origin)),
    }


@dataclass(frozen=True)
class HoverProvenance:
    """Where a measured cell came from, as its hover shows it: a few of the dataset's
    provenance columns (the image's digest in place of its tag where known) and its raw file."""

    engine_version: str | None
    image: str | None  # the image's digest, else its tag; None for an engine run as a process
    serve_command: str | None
    gpu: str | None
    hostname: str | None
    started_at: str | None
    raw_path: str | None


@dataclass(frozen=True)
class DepthCell:
    """One measured llama-benchy cell."""

    config: ConfigIdentity
    depth: int
    decode_tps: Measure | None
    ttft_ms: Measure | None
    prefill_tps: Measure | None
    runs: int | None
    acceptance_rate: float | None
    provenance: HoverProvenance


@dataclass(frozen=True)
class PositionAcceptance:
    """A speculative config's per-position acceptance over all its measured cells (the
    dataset's AcceptanceColumns hold one cell's)."""

    config: ConfigIdentity
    per_position: tuple[float, ...]
    cells: int


@dataclass(frozen=True)
class NaturalCell:
    """One measured natural-prompt cell."""

    config: ConfigIdentity
    prompt_class: str
    concurrency: int
    output_tok_s: float | None
    ttft_ms_p50: float | None
    ttft_ms_p95: float | None
    tpot_ms_p50: float | None
    tpot_ms_p95: float | None
    requests_ok: str
    provenance: HoverProvenance


@dataclass(frozen=True)
class ExplorerData:
    title: str
    configs: tuple[ConfigIdentity, ...]  # every config of the study, in config order
    depth: tuple[DepthCell, ...]
    speedups: tuple[Speedup, ...]
    acceptance: tuple[PositionAcceptance, ...]
    natural: tuple[NaturalCell, ...]
    # each config's declared weights origin, from the grid; a config not in it declares none
    origins: Mapping[str, WeightsOrigin | None] = field(default_factory=dict)
    quality: tuple[SpeedQuality, ...] = ()  # a study with a quality dataset: speed beside agreement

    def origin(self, config: ConfigIdentity) -> WeightsOrigin | None:
        return self.origins.get(config.config)

    def random_weight_configs(self) -> list[str]:
        """The configs on random weights, in config order: what they show is a mechanism check."""
        return [c.config for c in self.configs if is_random(self.origin(c))]


# --- frames to records -------------------------------------------------------------------


def _provenance(row: Row) -> HoverProvenance:
    return HoverProvenance(
        engine_version=optional_str(row.get("engine_version")),
        image=optional_str(row.get("image_digest")) or optional_str(row.get("image")),
        serve_command=optional_str(row.get("serve_command")),
        gpu=optional_str(row.get("gpu")),
        hostname=optional_str(row.get("hostname")),
        started_at=optional_str(row.get("started_at")),
        raw_path=optional_str(row.get("raw_path")),
    )


def _rows(frame: pd.DataFrame | None) -> list[Row]:
    return [] if frame is None else analysis.rows(frame)


def _depth_cell(row: Row, configs: Mapping[str, ConfigIdentity]) -> DepthCell:
    cell = CellMeasures.of(row)
    return DepthCell(
        config=configs[cell.config],
        depth=cell.depth,
        decode_tps=cell.measure("decode_tps"),
        ttft_ms=cell.measure("ttft_ms"),
        prefill_tps=cell.measure("prefill_tps"),
        runs=optional_int(row.get("runs")),
        acceptance_rate=cell.acceptance_rate,
        provenance=_provenance(row),
    )


def explorer_data(
    depth: pd.DataFrame,
    natural: pd.DataFrame | None,
    study: StudyInfo,
    title: str,
    origins: Mapping[str, WeightsOrigin | None] | None = None,
    quality: pd.DataFrame | None = None,
) -> ExplorerData:
    """The explorer's records from the dataset frames (``study``: the grid's, for baselines;
    ``origins``: each config's declared weights origin, weights_origin.config_origins of the
    grid; without them every config's origin is undeclared; ``quality``: the quality dataset,
    where the study has one)."""
    every_row = [*_rows(depth), *_rows(natural), *_rows(quality)]
    configs = {c.config: c for c in map(ConfigIdentity.from_row, every_row)}
    depth_cells = tuple(_depth_cell(r, configs) for r in _rows(analysis.measured(depth)))
    measured_cells = analysis.measured(depth)["config"].value_counts()
    acceptance = tuple(
        PositionAcceptance(configs[config], tuple(rates), int(measured_cells.get(config, 0)))
        for config, rates in analysis.acceptance_by_position(depth).items()
        if rates
    )
    natural_cells = tuple(
        NaturalCell(
            config=configs[str(r["config"])],
            prompt_class=str(r["prompt_class"]),
            concurrency=integer(r["concurrency"]),
            output_tok_s=optional_float(r.get("output_tok_s")),
            ttft_ms_p50=optional_float(r.get("ttft_ms_p50")),
            ttft_ms_p95=optional_float(r.get("ttft_ms_p95")),
            tpot_ms_p50=optional_float(r.get("tpot_ms_p50")),
            tpot_ms_p95=optional_float(r.get("tpot_ms_p95")),
            requests_ok=f"{optional_int(r.get('ok'))}/{optional_int(r.get('requests'))}",
            provenance=_provenance(r),
        )
        for r in _rows(None if natural is None else natural[natural["status"] == "ok"])
    )
    speedups = tuple(s for s in analysis.speedups(depth, study) if s.points)
    return ExplorerData(
        title,
        tuple(configs.values()),
        depth_cells,
        speedups,
        acceptance,
        natural_cells,
        {name: origin for name, origin in (origins or {}).items() if name in configs},
        tuple(speed_quality(quality, depth)) if quality is not None else (),
    )


# --- records to figures ------------------------------------------------------------------


@dataclass(frozen=True)
class PlotlyAxis:
    """An axis as plotly's layout takes it: plotly's keys in this order (the page's bytes),
    a setting left at None left out (plotly's default)."""

    title: str
    type: str | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)
    categoryorder: str | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)
    categoryarray: tuple[str, ...] | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)
    tickvals: tuple[int, ...] | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)
    ticktext: tuple[str, ...] | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)
    dtick: int | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)
    range: tuple[float, float] | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)


@dataclass(frozen=True)
class Axis:
    """A graph axis: its title and how it scales and ticks (None: plotly's default)."""

    title: str
    scale: str | None = None  # plotly's axis type: "linear", "log" or "category"
    categories: Sequence[str] | None = None  # a category axis's categories, in order
    ticks: Sequence[int] | None = None  # the values that get a tick, each labelled as itself
    dtick: int | None = None
    range: tuple[float, float] | None = None

    def to_plotly(self) -> PlotlyAxis:
        categories, ticks = self.categories, self.ticks
        return PlotlyAxis(
            title=self.title,
            type=self.scale,
            categoryorder=None if categories is None else "array",
            categoryarray=None if categories is None else tuple(categories),
            tickvals=None if ticks is None else tuple(ticks),
            ticktext=None if ticks is None else tuple(str(t) for t in ticks),
            dtick=self.dtick,
            range=self.range,
        )


def _measure(measure: Measure | None, unit: str) -> str:
    if measure is None:
        return "—"
    return f"{measure.mean:,.1f} ± {measure.std:,.1f} {unit}"


def _provenance_lines(prov: HoverProvenance) -> list[str]:
    command = prov.serve_command or "—"
    # a hover label does not wrap by itself
    chunks = [command[i : i + 100] for i in range(0, len(command), 100)]
    return [
        f"engine version: {prov.engine_version or '—'}",
        f"image: {prov.image or '— (process)'}",
        f"command: {chunks[0]}",
        *(f"    {chunk}" for chunk in chunks[1:]),
        f"GPU: {prov.gpu or '—'} on {prov.hostname or '—'}",
        f"measured: {prov.started_at or '—'}",
        f"raw file: {prov.raw_path or '—'}",
    ]


def _hover(
    config: ConfigIdentity,
    origin: WeightsOrigin | None,
    lines: Sequence[str],
    prov: HoverProvenance | None = None,
) -> str:
    # the weights line reads as the report's weights column
    text = [f"{config.config}: {config.config_label}", f"weights: {origin_text(origin)}", *lines]
    if prov is not None:
        text += _provenance_lines(prov)
    return "<br>".join(html.escape(line, quote=False) for line in text)


def _depth_hover(cell: DepthCell, origin: WeightsOrigin | None) -> str:
    lines = [
        f"depth: {cell.depth:,} tokens",
        f"decode: {_measure(cell.decode_tps, 'tok/s')}",
        f"TTFT: {_measure(cell.ttft_ms, 'ms')}",
        f"prefill: {_measure(cell.prefill_tps, 'tok/s')}",
        f"runs: {cell.runs if cell.runs is not None else '—'}",
    ]
    if cell.acceptance_rate is not None:
        lines.append(f"acceptance rate: {cell.acceptance_rate:.3f}")
    return _hover(cell.config, origin, lines, cell.provenance)


def _natural_hover(cell: NaturalCell, origin: WeightsOrigin | None) -> str:
    def ms(value: float | None) -> str:
        return "—" if value is None else f"{value:,.1f} ms"

    lines = [
        f"prompt class: {cell.prompt_class}, concurrency {cell.concurrency}",
        f"output: {'—' if cell.output_tok_s is None else f'{cell.output_tok_s:,.1f}'} tok/s",
        f"TTFT p50 / p95: {ms(cell.ttft_ms_p50)} / {ms(cell.ttft_ms_p95)}",
        f"TPOT p50 / p95: {ms(cell.tpot_ms_p50)} / {ms(cell.tpot_ms_p95)}",
        f"requests ok: {cell.requests_ok}",
    ]
    return _hover(cell.config, origin, lines, cell.provenance)


class Styler:
    """One colour per config, in config order; speculative configs dashed."""

    def __init__(self, data: ExplorerData):
        self.colors = {c.config: COLORS[i % len(COLORS)] for i, c in enumerate(data.configs)}
        self.origins = data.origins

    def trace(
        self,
        config: ConfigIdentity,
        x: Sequence[str] | Sequence[float],
        y: Sequence[float | None],
        hover: Sequence[str],
        name: str | None = None,
        symbol: str = "circle",
    ) -> go.Scatter:
        return go.Scatter(
            x=list(x),
            y=list(y),
            name=name or config.config,
            legendgroup=config.config,
            mode="lines+markers",
            line={
                "color": self.colors[config.config],
                "dash": "solid" if config.speculation_method == "none" else "dash",
            },
            marker={"symbol": symbol, "size": 7},
            hovertext=list(hover),
            hovertemplate="%{hovertext}<extra></extra>",
            meta={
                key: value for key, (value, _) in _choices(config, self.origins.get(config.config)).items()
            },
        )


def _figure(title: str, xaxis: Axis, yaxis: Axis, empty_reason: str) -> go.Figure:
    fig = go.Figure()
    grid = {"gridcolor": "#e5e5e5", "zeroline": False}
    fig.update_layout(
        title=title,
        xaxis={**grid, **codec.to_json(xaxis.to_plotly())},
        yaxis={**grid, **codec.to_json(yaxis.to_plotly())},
        height=480,
        margin={"t": 60, "r": 20},
        hoverlabel={"align": "left", "font": {"family": "monospace", "size": 11}},
        template="none",  # a named template is 7 kB of JSON in every figure
        plot_bgcolor="white",
        showlegend=True,  # also for a single trace, which names its config
    )
    fig.add_annotation(
        text=f"no data: {empty_reason}",
        showarrow=False,
        xref="paper",
        yref="paper",
        x=0.5,
        y=0.5,
        name="no-data",
        visible=True,
    )
    return fig


def _finish(fig: go.Figure) -> go.Figure:
    """Drop the no-data note from a figure that got traces."""
    if fig.data:
        fig.layout.annotations = [a for a in fig.layout.annotations if a.name != "no-data"]
    return fig


def _depth_axis(depths: Sequence[int]) -> Axis:
    # categories: depths grow by powers of two from 0, which no log axis can show
    return Axis(
        "context depth (tokens)", scale="category", categories=[analysis.short_depth(d) for d in depths]
    )


def depth_figure(
    data: ExplorerData,
    styler: Styler,
    metric: Callable[[DepthCell], Measure | None],
    title: str,
    ytitle: str,
    log: bool,
) -> go.Figure:
    depths = sorted({c.depth for c in data.depth})
    fig = _figure(
        title,
        _depth_axis(depths),
        Axis(ytitle, scale="log" if log else "linear"),
        "no measured llama-benchy cell",
    )
    for config in data.configs:
        measured = [(c, m) for c in data.depth if c.config == config and (m := metric(c)) is not None]
        if measured:
            fig.add_trace(
                styler.trace(
                    config,
                    [analysis.short_depth(c.depth) for c, _ in measured],
                    [m.mean for _, m in measured],
                    [_depth_hover(c, data.origin(config)) for c, _ in measured],
                )
            )
    return _finish(fig)


def speedup_figure(data: ExplorerData, styler: Styler) -> go.Figure:
    depths = sorted({p.depth for s in data.speedups for p in s.points})
    fig = _figure(
        "Decode speedup over the baseline vs context depth",
        _depth_axis(depths),
        Axis("decode tok/s ÷ baseline's", scale="log"),
        "no config with a measured baseline",
    )
    configs = {c.config: c for c in data.configs}
    cells = {(c.config.config, c.depth): c for c in data.depth}
    for speedup in data.speedups:
        mine = configs[speedup.config]
        hover = [
            _hover(
                mine,
                data.origin(mine),
                [
                    f"over {speedup.baseline} at depth {p.depth:,}:"
                    f" {p.speedup.mean:.3f} ± {p.speedup.std:.3f} ({p.outcome})",
                    f"decode: {_measure(p.config, 'tok/s')}",
                    f"baseline decode: {_measure(p.baseline, 'tok/s')}",
                ],
                cells[(speedup.config, p.depth)].provenance,
            )
            for p in speedup.points
        ]
        fig.add_trace(
            styler.trace(
                mine,
                [analysis.short_depth(p.depth) for p in speedup.points],
                [p.speedup.mean for p in speedup.points],
                hover,
                name=f"{speedup.config} / {speedup.baseline}",
            )
        )
    fig.add_hline(y=1.0, line={"color": "#888", "width": 1})
    return _finish(fig)


def acceptance_figure(data: ExplorerData, styler: Styler) -> go.Figure:
    fig = _figure(
        "Speculative decoding: acceptance per draft position (all measured cells, weighted by drafts)",
        Axis("draft position", dtick=1),
        Axis("accepted per draft", range=(0, 1.05)),
        "no speculative config with per-position counters",
    )
    for series in data.acceptance:
        positions = range(1, len(series.per_position) + 1)
        hover = [
            _hover(
                series.config,
                data.origin(series.config),
                [f"position {i}: {rate:.3f} accepted per draft", f"cells: {series.cells}"],
            )
            for i, rate in zip(positions, series.per_position, strict=True)
        ]
        fig.add_trace(styler.trace(series.config, positions, series.per_position, hover))
    return _finish(fig)


def natural_figure(
    data: ExplorerData,
    styler: Styler,
    metric: Callable[[NaturalCell], float | None],
    title: str,
    ytitle: str,
) -> go.Figure:
    levels = sorted({c.concurrency for c in data.natural})
    fig = _figure(
        title,
        Axis("concurrency", scale="log", ticks=levels),
        Axis(ytitle),
        "no measured natural-prompt cell",
    )
    classes = list(dict.fromkeys(c.prompt_class for c in data.natural))
    for config in data.configs:
        # a config's prompt classes share its colour; the marker tells them apart
        for prompt_class, symbol in zip(classes, itertools.cycle(SYMBOLS)):
            mine = [c for c in data.natural if c.config == config and c.prompt_class == prompt_class]
            cells = sorted((c for c in mine if metric(c) is not None), key=lambda c: c.concurrency)
            if cells:
                name = config.config if len(classes) == 1 else f"{config.config} · {prompt_class}"
                fig.add_trace(
                    styler.trace(
                        config,
                        [c.concurrency for c in cells],
                        [metric(c) for c in cells],
                        [_natural_hover(c, data.origin(config)) for c in cells],
                        name=name,
                        symbol=symbol,
                    )
                )
    return _finish(fig)


def quality_figure(data: ExplorerData, styler: Styler) -> go.Figure:
    """Each config's agreement with its reference over its decode speed-up over that reference."""
    fig = _figure(
        "Quality against speed: greedy agreement with the reference over decode speed-up",
        Axis("decode tok/s ÷ the reference's"),
        Axis("positions matching the reference's greedy output (%)"),
        "no config has quality results and a decode speed at a depth its reference measured",
    )
    configs = {c.config: c for c in data.configs}
    for point in data.quality:
        if point.speedup is None:
            continue
        mine, speedup = configs[point.config], point.speedup
        lines = [
            f"reference: {point.reference}",
            f"matching positions: {point.agreement_pct:.1f} % of {point.agreement_unit}",
            f"identical outputs: {point.identical_outputs_pct:.0f} %",
            f"decode over the reference at depth {speedup.depth:,}: "
            f"{speedup.speedup.mean:.3f} ± {speedup.speedup.std:.3f}",
            "on the speed–quality frontier" if point.on_frontier else "beaten on both by another config",
        ]
        if point.kl_divergence_mean is not None and point.top1_agreement_pct is not None:
            lines.append(
                f"teacher-forced: KL {point.kl_divergence_mean:.4f} nats/token, "
                f"top-1 agreement {point.top1_agreement_pct:.1f} %"
            )
        trace = styler.trace(
            mine, [speedup.speedup.mean], [point.agreement_pct], [_hover(mine, data.origin(mine), lines)]
        )
        fig.add_trace(trace.update(mode="markers"))
    return _finish(fig)


def figures(data: ExplorerData) -> dict[str, go.Figure]:
    """Every graph of the explorer by its element id, in page order (the quality graph where
    the study has quality results)."""
    styler = Styler(data)
    quality = {"quality_frontier": quality_figure(data, styler)} if data.quality else {}
    return {
        "decode_vs_depth": depth_figure(
            data,
            styler,
            lambda c: c.decode_tps,
            "Decode throughput vs context depth",
            "decode tok/s",
            log=False,
        ),
        "ttft_vs_depth": depth_figure(
            data,
            styler,
            lambda c: c.ttft_ms,
            "Time to first token vs context depth",
            "TTFT (ms, log scale)",
            log=True,
        ),
        "speedup_vs_depth": speedup_figure(data, styler),
        "acceptance_per_position": acceptance_figure(data, styler),
        "natural_tok_s": natural_figure(
            data,
            styler,
            lambda c: c.output_tok_s,
            "Natural prompts: aggregate output tok/s vs concurrency",
            "tok/s",
        ),
        "natural_ttft": natural_figure(
            data, styler, lambda c: c.ttft_ms_p50, "Natural prompts: TTFT p50 vs concurrency", "TTFT p50 (ms)"
        ),
        "natural_tpot": natural_figure(
            data, styler, lambda c: c.tpot_ms_p50, "Natural prompts: TPOT p50 vs concurrency", "TPOT p50 (ms)"
        ),
        **quality,
    }


# --- the page ----------------------------------------------------------------------------

# Hides every trace whose config has an unchecked engine, checkpoint, speculation or weights
# origin; shows the mechanism-check note while a trace on random weights is shown.
FILTER_SCRIPT = """
const facets = FACET_KEYS;
const traceCount = TRACE_COUNT;
function applyFilters() {
  const allowed = {};
  for (const facet of facets) {
    allowed[facet] = new Set(
      [...document.querySelectorAll(`input[data-facet="${facet}"]:checked`)].map((box) => box.value));
  }
  let shown = 0;
  let randomShown = false;
  for (const plot of document.querySelectorAll(".js-plotly-plot")) {
    if (!plot.data.length) continue;
    const visible = plot.data.map((trace) => facets.every((f) => allowed[f].has(trace.meta[f])));
    shown += visible.filter(Boolean).length;
    randomShown ||= plot.data.some((trace, i) => visible[i] && trace.meta.origin === "random");
    Plotly.restyle(plot, {visible: visible});
  }
  document.getElementById("shown").textContent = `${shown} of ${traceCount} traces shown`;
  const note = document.getElementById("mechanism-check");
  if (note) note.hidden = !randomShown;
}
for (const box of document.querySelectorAll("input[data-facet]")) {
  box.addEventListener("change", applyFilters);
}
applyFilters();
"""

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
fieldset { display: inline-block; vertical-align: top; margin: 0 1em 1em 0; }
label { display: block; font-size: 0.9em; }
#shown { color: #555; }
#mechanism-check { background: #fff4d6; border-left: 4px solid #e0a800; padding: 0.5em 0.8em; }
"""


def _filters(data: ExplorerData) -> str:
    groups = []
    for facet, heading in FACETS:
        options = dict(_choices(c, data.origin(c))[facet] for c in data.configs)
        boxes = "".join(
            f'<label><input type="checkbox" data-facet="{facet}" value="{html.escape(value)}" checked> '
            f"{html.escape(label)}</label>"
            for value, label in options.items()
        )
        groups.append(f"<fieldset><legend>{html.escape(heading)}</legend>{boxes}</fieldset>")
    return "".join(groups)


def mechanism_note(data: ExplorerData) -> str | None:
    """What the page says while a config on random weights is shown, in the report's words;
    None where no config declares random weights."""
    random = data.random_weight_configs()
    if not random:
        return None
    if len(random) == len(data.configs):
        who = "every config here serves random weights, so the"
    else:
        who = f"{and_list(random)} {'serves' if len(random) == 1 else 'serve'} random weights, so"
        who += " its" if len(random) == 1 else " their"
    return f"{MECHANISM_CHECK}, not a finding: {who} points show that {RANDOM_WEIGHTS_SHOW}."


def _note(data: ExplorerData) -> str:
    text = mechanism_note(data)
    return "" if text is None else f'<p id="mechanism-check" role="note">{html.escape(text)}</p>\n'


def render_explorer(data: ExplorerData, plotly_js: str) -> str:
    """The page: ``plotly_js`` (plotly.offline.get_plotlyjs()) inlined, no other resource."""
    graphs = figures(data)
    divs = "\n".join(
        fig.to_html(full_html=False, include_plotlyjs=False, div_id=name, config={"displaylogo": False})
        for name, fig in graphs.items()
    )
    trace_count = sum(len(fig.data) for fig in graphs.values())
    script = FILTER_SCRIPT.replace("FACET_KEYS", json.dumps([f for f, _ in FACETS])).replace(
        "TRACE_COUNT", str(trace_count)
    )
    title = html.escape(data.title)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>{STYLE}</style>
<script>{plotly_js}</script>
</head>
<body>
<h1>{title}</h1>
<p>{len(data.configs)} configs, {len(data.depth)} measured depth cells, {len(data.natural)} measured
natural-prompt cells. Hover a point for the cell's values, provenance and weights; untick a box to hide
its configs. <span id="shown"></span></p>
{_note(data)}<div id="filters">{_filters(data)}</div>
{divs}
<script>{script}</script>
</body>
</html>
"""


def write_explorer(
    out: Path,
    depth: pd.DataFrame,
    natural: pd.DataFrame | None,
    study: StudyInfo,
    origins: Mapping[str, WeightsOrigin | None] | None = None,
    quality: pd.DataFrame | None = None,
) -> ExplorerData:
    """Render the explorer of these frames to ``out``, plotly's bundle inlined."""
    from plotly.offline import get_plotlyjs

    data = explorer_data(depth, natural, study, study.title or "gridbench explorer", origins, quality)
    atomic_write_text(out, render_explorer(data, get_plotlyjs()))
    return data
