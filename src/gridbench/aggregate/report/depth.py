"""The depth sweep's sections: summary, speedup, engines, start-up, roofline, acceptance,
the prefix-cache pass."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from gridbench.aggregate import analysis
from gridbench.aggregate.analysis import LOSS, WIN, Measure
from gridbench.aggregate.records import missing
from gridbench.aggregate.report.markdown import code, depth_list, table
from gridbench.aggregate.text import DASH, num, pct, pm, ratio_text, span
from gridbench.aggregate.verdict import MARKS, configs_by_name, pair_label, runs_text
from gridbench.config.grid import StudyInfo


def engine_pair_labels(dataset: pd.DataFrame) -> dict[str, str]:
    return {name: pair_label(config) for name, config in configs_by_name(dataset).items()}


def _oriented(c: analysis.Speedup) -> tuple[str, str, list[analysis.SpeedupPoint]]:
    """(faster config, slower config, points of faster over slower) when one is slower at
    every depth; the comparison as it is otherwise."""
    if any(p.outcome != LOSS for p in c.points):
        return c.config, c.baseline, list(c.points)
    flipped = [
        analysis.SpeedupPoint(p.depth, p.baseline, p.config, p.baseline.ratio(p.config), WIN)
        for p in c.points
    ]
    return c.baseline, c.config, flipped


def _depth_span(points: Sequence[analysis.SpeedupPoint]) -> str:
    first, last = points[0].depth, points[-1].depth
    return str(first) if first == last else f"{first}–{last}"


def engine_summary(c: analysis.Speedup, labels: Mapping[str, str]) -> str:
    """One line on an engine comparison, e.g. "vLLM BF16 decodes 1.80–2.30× as fast as
    llama.cpp F16 at every depth 0–65536"."""
    points = c.points
    where = f"at depth {points[0].depth}" if len(points) == 1 else f"at every depth {_depth_span(points)}"
    if c.all_tie:
        return f"{labels[c.config]} and {labels[c.baseline]} tie on decode {where}, within the runs' spread"
    fast, slow, oriented = _oriented(c)
    low = f"{min(p.speedup.mean for p in oriented):.2f}"
    high = f"{max(p.speedup.mean for p in oriented):.2f}"
    text = f"{labels[fast]} decodes {low if low == high else f'{low}–{high}'}× as fast as {labels[slow]}"
    if all(p.outcome == WIN for p in oriented):
        return f"{text} {where}"
    runs = [f"{MARKS[o]} at {a}" if a == b else f"{MARKS[o]} {a}–{b}" for o, a, b in c.runs()]
    return f"{text}: " + ", ".join(runs)


def crossover_text(s: analysis.Speedup) -> str:
    crossover = s.crossover
    if crossover:
        text = f"stops beating it between {crossover[0]} and {crossover[1]} tokens"
        loss = s.first_loss_after_crossover
        if loss is not None:
            text += (
                f" (slower from {loss})"
                if loss == crossover[1]
                else f" (tie at {crossover[1]}, slower from {loss})"
            )
        return text
    outcomes = {p.outcome for p in s.points}
    if outcomes == {WIN}:
        if len(s.points) == 1:
            return f"faster at the one depth measured ({s.points[0].depth})"
        return f"faster at every depth measured ({s.points[0].depth}–{s.points[-1].depth})"
    if outcomes == {LOSS}:
        return f"slower at every depth measured ({span(s.points[0].depth, s.points[-1].depth)})"
    if WIN not in outcomes:
        return "never faster: " + runs_text(s)
    return runs_text(s)


def _value(cells: analysis.CellIndex, config: str, depth: int, column: str) -> str:
    cell = cells.get((config, depth))
    if cell is None:
        return DASH
    if cell.status != "ok":
        return cell.status
    return pm(cell.measure(column))


def summary_table(dataset: pd.DataFrame) -> str:
    scheduled = dataset[dataset["status"] != "skipped"]
    depths = sorted(int(d) for d in scheduled["context_tokens"].dropna().unique())
    decode = analysis.pick_depths(depths, analysis.SUMMARY_DECODE_DEPTHS, 4)
    ttft = analysis.pick_depths(depths, analysis.SUMMARY_TTFT_DEPTHS, 2)
    if not decode and not ttft:
        return "No depth was measured."
    header = ["config"] + [f"decode @{analysis.short_depth(d)} (tok/s)" for d in decode]
    header += [f"TTFT @{analysis.short_depth(d)} (ms)" for d in ttft]
    rows = []
    cells = analysis.cell_index(dataset)
    for config in analysis.config_order(dataset):
        row = [code(config)] + [_value(cells, config, d, "decode_tps") for d in decode]
        row += [_value(cells, config, d, "ttft_ms") for d in ttft]
        rows.append(row)
    note = ""
    if any(d not in analysis.SUMMARY_DECODE_DEPTHS for d in decode) or any(
        d not in analysis.SUMMARY_TTFT_DEPTHS for d in ttft
    ):
        note = (
            "\n\nThe grid lacks the usual 4k/16k/32k depths: the columns show depths spread over "
            f"its {depth_list(depths)}."
        )
    return table(header, rows) + note


def speedup_section(dataset: pd.DataFrame, study: StudyInfo) -> str:
    series = [s for s in analysis.speedups(dataset, study) if s.points]
    if not series:
        return (
            "No config has a baseline measured at the same depths (name one per config in "
            "`study.baseline`, or add a non-speculative config on the same engine and checkpoint)."
        )
    summary = []
    for s in series:
        best = max(s.points, key=lambda p: p.speedup.mean)
        worst = min(s.points, key=lambda p: p.speedup.mean)
        summary.append(
            (
                code(s.config),
                code(s.baseline),
                f"{ratio_text(best.speedup)} @{best.depth}",
                f"{ratio_text(worst.speedup)} @{worst.depth}",
                crossover_text(s),
            )
        )
    text = table(("config", "baseline", "best", "worst", "crossover"), summary)
    depths = sorted({p.depth for s in series for p in s.points})
    by_depth = []
    for depth in depths:
        row: list[object] = [depth]
        for s in series:
            point = next((p for p in s.points if p.depth == depth), None)
            row.append(f"{ratio_text(point.speedup)} {MARKS[point.outcome]}" if point else DASH)
        by_depth.append(row)
    header = ["depth"] + [f"{s.config} ÷ {s.baseline}" for s in series]
    return (
        text
        + "\n\nDecode speedup per depth (faster / slower / tie under the tie rule):\n\n"
        + table(header, by_depth)
    )


def engine_section(dataset: pd.DataFrame) -> str:
    comparisons = [c for c in analysis.engine_comparisons(dataset) if c.points]
    meta = dataset.drop_duplicates("config")
    if not comparisons:
        if meta["engine"].nunique() < 2:
            return "Only one engine in this study."
        if meta.groupby("weights")["engine"].nunique().max() < 2:
            return "No two engines share weights: set checkpoints' `weights` to compare them."
        return (
            "No two configs on different engines serve the same weights with the same speculation "
            "method and draft length at a depth both measured."
        )
    labels = engine_pair_labels(dataset)
    weights = meta.set_index("config")["weights"]
    cells = analysis.cell_index(dataset)
    blocks = []
    for c in comparisons:
        a, b = labels[c.config], labels[c.baseline]
        rows = [
            (
                p.depth,
                pm(p.config),
                pm(p.baseline),
                f"{ratio_text(p.speedup)} {MARKS[p.outcome]}",
                pm(analysis.measure_at(cells, c.config, p.depth, "ttft_ms")),
                pm(analysis.measure_at(cells, c.baseline, p.depth, "ttft_ms")),
            )
            for p in c.points
        ]
        header = (
            "depth",
            f"{a} decode (tok/s)",
            f"{b} decode (tok/s)",
            "decode ratio",
            f"{a} TTFT (ms)",
            f"{b} TTFT (ms)",
        )
        blocks.append(
            f"### {a} vs {b}\n\n`{c.config}` ÷ `{c.baseline}`, weights `{weights[c.config]}`: "
            f"{engine_summary(c, labels)}.\n\n" + table(header, rows)
        )
    return (
        "Engine pairs as Method defines them; decode ratio = the first's decode tok/s ÷ the "
        "second's, faster / slower / tie under the tie rule.\n\n" + "\n\n".join(blocks)
    )


def _duration(seconds: float) -> str:
    return f"{num(seconds)} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _starts(count: int) -> str:
    return f"{count} start{'s' if count != 1 else ''}"


def startup_section(
    dataset: pd.DataFrame,
    natural: pd.DataFrame | None,
    quality: pd.DataFrame | None = None,
    load: pd.DataFrame | None = None,
    sessions: pd.DataFrame | None = None,
) -> str:
    """Every start that measured cells of any kind ran on: a quality cell's own start, and a
    load or session cell's start after a sweep stopped its engine, show what a start costs as
    much as the depth and natural cells' do (a warm compile cache among them)."""
    cells = analysis.session_cells(sessions) if sessions is not None else None
    starts = analysis.engine_starts([dataset, natural, quality, load, cells])
    if not starts:
        return "No measured cell recorded its engine's start-up."
    total = sum(s.startup_s for s in starts)
    per_engine: dict[str, list[float]] = {}
    for s in starts:
        per_engine.setdefault(s.engine_label, []).append(s.startup_s)
    split = ""
    if len(per_engine) > 1:
        parts = [f"{e}: {_starts(len(times))}, {_duration(sum(times))}" for e, times in per_engine.items()]
        split = f" ({'; '.join(parts)})"
    cached = [s for s in starts if s.compile_cache is not None]
    header: tuple[str, ...] = ("config", "engine", "cold start to healthy (s)", "measured cells on it")
    header += ("compile cache",) if cached else ()
    rows = [
        (", ".join(code(c) for c in s.configs), s.engine_label, num(s.startup_s, 1), s.cells)
        + ((s.compile_cache or DASH,) if cached else ())
        for s in starts
    ]
    return (
        "Each engine start the measured cells ran on, from launch until the health path answers "
        "and the model is listed (`engine_startup_s`). Start-up is part of what a sweep costs: "
        f"{_starts(len(starts))} took {_duration(total)} in all{split}.{_cache_note(cached)}\n\n"
        + table(header, rows)
    )


def _cache_note(cached: list[analysis.EngineStart]) -> str:
    """How many starts loaded what an earlier start compiled, or nothing where no start kept a
    compile cache."""
    if not cached:
        return ""
    hits = sum(1 for s in cached if s.compile_cache == "hit")
    return (
        f" {hits} of the {_starts(len(cached))} that keep a compile cache loaded their compiled "
        "graphs from it and compiled none, by the engine's own log (`engine_compile_cache`: the "
        "artifacts of an earlier start of the same engine build, model and serve flags, kept in "
        "`resources/engine-cache/`); every start still ran until healthy and each cell warmed its "
        "engine up as before."
    )


def roofline_section(dataset: pd.DataFrame, study: StudyInfo) -> str:
    bandwidth = study.hardware.memory_bandwidth_gb_s
    if not bandwidth:
        return "`study.hardware.memory_bandwidth_gb_s` is not set: no roofline."
    lines = analysis.rooflines(dataset, bandwidth)
    configs = analysis.config_order(dataset)
    without = [c for c in configs if c not in {r.config for r in lines}]
    text = f"Ceiling = {bandwidth} GB/s ÷ active weights read per token.\n\n"
    text += table(
        ("config", "active weights (GB)", "ceiling (tok/s)", "depth", "decode (tok/s)", "realised"),
        [
            (
                code(r.config),
                num(r.active_weight_gb),
                num(r.ceiling_tok_s),
                r.depth,
                pm(r.decode),
                pct(r.realised),
            )
            for r in lines
        ],
    )
    if any(r.realised > 1 for r in lines):
        text += (
            "\n\nAbove 100 %: with speculative decoding one read of the target's weights "
            "verifies several tokens."
        )
    if without:
        text += (
            "\n\nNo roofline for "
            + ", ".join(code(c) for c in without)
            + " (no `active_weight_gb` on its checkpoint, or no measured cell)."
        )
    return text


def acceptance_section(dataset: pd.DataFrame) -> str:
    spec = dataset[dataset["speculation_method"] != "none"]
    if spec.empty:
        return "No config speculates."
    ok = analysis.measured(spec)
    per_position = analysis.acceptance_by_position(dataset)
    rows = []
    for config in analysis.config_order(spec):
        mine = ok[ok["config"] == config].dropna(subset=["spec_drafts"])
        drafts = mine["spec_drafts"].astype(float).sum()
        accepted = mine["spec_accepted_tokens"].astype(float).sum()
        drafted = mine["spec_draft_tokens"].astype(float).sum()
        rates = per_position.get(config)
        rows.append(
            (
                code(config),
                num(drafts, 0) if drafts else DASH,
                pct(accepted / drafted) if drafted else DASH,
                num(1 + accepted / drafts, 2) if drafts else DASH,
                " ".join(f"{r * 100:.0f}" for r in rates) if rates else DASH,
            )
        )
    pooled = table(
        ("config", "drafts", "acceptance rate", "mean acceptance length", "per position (%)"), rows
    )
    configs = analysis.config_order(spec)
    by_depth = []
    cells = analysis.cell_index(ok)
    for depth in sorted(int(d) for d in ok["context_tokens"].unique()):
        row: list[object] = [depth]
        for config in configs:
            cell = cells.get((config, depth))
            rate = None if cell is None else cell.acceptance_rate
            row.append(DASH if rate is None else pct(rate))
        by_depth.append(row)
    return (
        "Pooled over every measured depth cell (Σ accepted ÷ Σ drafted, mean acceptance length = "
        "1 + Σ accepted ÷ Σ drafts):\n\n"
        + pooled
        + "\n\nAcceptance rate per depth:\n\n"
        + table(["depth", *configs], by_depth)
    )


def cached_section(dataset: pd.DataFrame) -> str:
    rows = analysis.with_cached(dataset)
    if rows.empty:
        return "No prefix-cache cell is scheduled (every depth of the pass's configs is 0 or skipped)."
    intro = (
        "Each depth above 0 of the configs in `benchy.prefix_cache_pass` is measured twice: cold "
        "(the depth cell) and with llama-benchy's `--enable-prefix-caching`, which first sends the "
        "context alone and then the context with the prompt, on the config's engine with its "
        "prefix cache on. Speedup = cold TTFT ÷ cached TTFT; a failed cell says so."
    )
    blocks = [intro]
    for config, mine in rows.groupby("config", sort=False):
        lines = []
        for row in mine.sort_values("context_tokens").to_dict("records"):
            cold = (
                pm(Measure.of(row["ttft_ms"], row["ttft_ms_std"])) if row["status"] == "ok" else row["status"]
            )
            cached = (
                pm(Measure.of(row["ttft_ms_cached"], row["ttft_ms_cached_std"]))
                if row["cached_status"] == "ok"
                else row["cached_status"]
            )
            speedup = row["ttft_cached_speedup"]
            lines.append(
                (
                    row["context_tokens"],
                    cold,
                    cached,
                    DASH if missing(speedup) else f"{speedup:.2f}×",
                )
            )
        blocks.append(
            f"### `{config}`: {mine.iloc[0]['config_label']}\n\n"
            + table(("depth", "cold TTFT (ms)", "cached TTFT (ms)", "speedup"), lines)
        )
    return "\n\n".join(blocks)
