"""comparison.md, generated in full: a pure function of the dataset frames and the grid.

The same frames and grid give the same bytes (no clock, no host lookups): the report of a
rerun changes only where the data did.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from gridbench import layout
from gridbench.aggregate import analysis
from gridbench.aggregate.analysis import LOSS, WIN, Measure
from gridbench.aggregate.checks import run_checks
from gridbench.aggregate.text import DASH, num, pct, pm, ratio_text, span
from gridbench.aggregate.verdict import (
    MARKS,
    capacity_targets,
    config_meta,
    runs_text,
    targets_text,
    verdict_lines,
)
from gridbench.grid import Grid, StudyInfo

# --- formatting -------------------------------------------------------------------------


def cell_text(value: Any) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return DASH
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell_text(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def code(text: Any) -> str:
    return DASH if text is None or text is pd.NA else f"`{text}`"


def depth_list(depths: Iterable[int]) -> str:
    return ", ".join(str(d) for d in depths)


# --- the report -------------------------------------------------------------------------


def render_report(
    grid: Grid,
    dataset: pd.DataFrame,
    natural: pd.DataFrame | None = None,
    graphs: Sequence[str] = (),
) -> str:
    """The whole comparison.md. ``graphs`` are links to the PNG files, relative to the report."""
    study = grid.study
    # plain object columns: the many small selections below run ~3x faster than on Arrow
    # strings and nullable dtypes, and every value renders the same
    dataset = dataset.astype(object)
    natural = natural.astype(object) if natural is not None and not natural.empty else None
    sections = [
        f"# {study.title or 'gridbench comparison'}",
        partial_banner(dataset, natural),
        "## Verdict\n\n" + verdict(grid, dataset, natural),
        "## Checks\n\n" + checks_section(grid, dataset, natural),
        "## Method\n\n" + method(grid, dataset, natural),
        "## Environment and provenance\n\n" + environment(grid, dataset, natural),
        "## Configs\n\n" + configs_table(grid, dataset),
        "## Summary: decode tok/s and TTFT by context depth\n\n" + summary_table(dataset),
        "## Speedup over baseline\n\n" + speedup_section(dataset, study),
        "## Engine comparison\n\n" + engine_section(dataset),
        "## Engine start-up\n\n" + startup_section(dataset, natural),
        "## Roofline realisation\n\n" + roofline_section(dataset, study),
        "## Speculative decoding acceptance\n\n" + acceptance_section(dataset),
    ]
    if grid.prefix_cache_pass:
        sections.append("## Prefix cache: TTFT cold vs cached context\n\n" + cached_section(dataset))
    if grid.natural:
        sections += [
            "## Natural prompts\n\n" + natural_section(natural),
            "## Capacity under latency targets\n\n" + capacity_section(natural, study),
            "## Pareto frontier: throughput per GPU against per-user speed\n\n"
            + pareto_section(natural, study),
        ]
    sections += [
        "## Failed and skipped cells\n\n" + failures_section(dataset, natural),
        "## Graphs\n\n" + graphs_section(graphs),
        "## Full data\n\n" + full_data(dataset),
    ]
    return "\n\n".join(s for s in sections if s) + "\n"


def _failed(frame: pd.DataFrame | None) -> int:
    return 0 if frame is None else int((frame["status"] == "failed").sum())


def _failed_cached(dataset: pd.DataFrame) -> int:
    return int((analysis.with_cached(dataset)["cached_status"] == "failed").sum())


def is_partial(dataset: pd.DataFrame, natural: pd.DataFrame | None) -> bool:
    return _failed(dataset) + _failed_cached(dataset) + _failed(natural) > 0


def partial_banner(dataset: pd.DataFrame, natural: pd.DataFrame | None) -> str:
    if not is_partial(dataset, natural):
        return ""
    scheduled = int((dataset["status"] != "skipped").sum())
    parts = [f"{_failed(dataset)} of {scheduled} depth cells"]
    cached = analysis.with_cached(dataset)
    if not cached.empty:
        parts.append(f"{_failed_cached(dataset)} of {len(cached)} prefix-cache cells")
    if natural is not None:
        parts.append(f"{_failed(natural)} of {len(natural)} natural-prompt cells")
    return (
        f"> **Partial results.** {' and '.join(parts)} failed. They are listed with their "
        "reasons under [Failed and skipped cells](#failed-and-skipped-cells); no value, graph "
        "or statement below comes from them."
    )


# --- verdict ----------------------------------------------------------------------------


def verdict(grid: Grid, dataset: pd.DataFrame, natural: pd.DataFrame | None) -> str:
    lines = verdict_lines(dataset, natural, grid.study)
    # a caveat belongs next to the conclusions it qualifies, not only further down
    checks = run_checks(dataset, natural, grid.study)
    warned = [check.title for check in checks if check.triggered]
    if warned:
        lines.append(
            f"Read these with the [Checks](#checks): {len(warned)} of {len(checks)} "
            f"{'warns' if len(warned) == 1 else 'warn'} "
            f"({'; '.join(warned)})."
        )
    return "\n".join(f"- {line}" for line in lines)


def checks_section(grid: Grid, dataset: pd.DataFrame, natural: pd.DataFrame | None) -> str:
    lines = [f"- {check.line}" for check in run_checks(dataset, natural, grid.study)]
    return (
        "What an expert would question before trusting these numbers; a warning names the cells "
        "and, where known, what typically causes it.\n\n" + "\n".join(lines)
    )


def engine_pair_labels(dataset: pd.DataFrame) -> dict[str, str]:
    return {config: meta.pair_label for config, meta in config_meta(dataset).items()}


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


def _crossover_text(s: analysis.Speedup) -> str:
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


# --- method and environment -------------------------------------------------------------


def _extra_body(body: Mapping[str, Any]) -> str:
    return f", extra body `{json.dumps(body, sort_keys=True)}`" if body else ""


def method(grid: Grid, dataset: pd.DataFrame, natural: pd.DataFrame | None) -> str:
    study = grid.study
    b = grid.benchy
    versions = sorted(set(analysis.measured(dataset)["load_generator_version"].dropna().astype(str)))
    lines = []
    if study.description:
        lines += [study.description.strip(), ""]
    lines.append(
        f"- Depth sweep: llama-benchy {', '.join(versions) or '(no cell measured)'}, "
        f"`--pp {b.pp} --tg {b.tg}{' --exact-tg' if b.exact_tg else ''} --runs {b.runs} "
        f"--concurrency {b.concurrency} --latency-mode {b.latency_mode}`, "
        f"{'with' if b.warmup else 'without'} its warm-up request{_extra_body(b.extra_body)}, "
        f"at depths {depth_list(grid.depths)}. "
        "A cell whose depth + pp + tg exceeds the config's max model length is skipped."
    )
    if grid.natural:
        n = grid.natural
        lines.append(
            f"- Natural prompts: classes {', '.join(n.prompt_classes)} at concurrency "
            f"{', '.join(map(str, sorted(n.concurrency)))}, {n.requests} measured requests per level, "
            f"max_tokens {n.max_tokens}, temperature {n.temperature}, {n.warmup} serial warm-up "
            f"requests per class{', cache-busting prefix per request' if n.cache_bust else ''}"
            f"{_extra_body(n.extra_body)}; "
            "percentiles are nearest-rank over the ok requests, and failed requests are counted, "
            "never dropped."
        )
    lines += [
        "- Spread: each depth value is the mean of the runs ± their standard deviation as "
        "llama-benchy reports it. Two values differ only when |a − b| > √(sa² + sb²); otherwise "
        "they **tie** (a missing std counts as 0).",
        "- Speedup = decode tok/s of a config ÷ decode tok/s of its baseline at the same depth, "
        "its spread propagated from both. The baseline is the one `study.baseline` names, else the "
        "non-speculative config on the same engine and checkpoint. The crossover is where a config "
        "stops beating its baseline: the last depth of its leading run of wins and the next depth measured.",
        "- Engine comparison: configs on different engines that serve the same weights "
        "(`checkpoints.*.weights`, else the checkpoint) with the same speculation method and draft "
        "length, decode tok/s on the engine that comes first in the config order ÷ decode tok/s on "
        "the other, at every depth both measured.",
        "- Quantization: each non-speculative config ÷ the config on the same engine that serves "
        "the same model (`checkpoints.*.weights`; where no checkpoint declares one, one model per engine) "
        "in the most bytes per token, at every depth both measured.",
        "- Verdict: one line per finding, configs that share a conclusion merged, ordered by the "
        "largest ratio each rests on, either way (0.5× counts as much as 2×; a tie as none).",
        "- Roofline: ceiling = memory bandwidth ÷ gigabytes of active weights read per token "
        "(`study.hardware.memory_bandwidth_gb_s`, `checkpoints.*.active_weight_gb`); realised = "
        "measured decode ÷ ceiling, at the smallest depth measured.",
    ]
    return "\n".join(lines)


def _distinct(frames: Iterable[pd.DataFrame | None], column: str) -> list[str]:
    values: dict[str, None] = {}
    for frame in frames:
        if frame is not None:
            for value in analysis.measured(frame)[column].dropna():
                values[str(value)] = None
    return list(values)


def environment(grid: Grid, dataset: pd.DataFrame, natural: pd.DataFrame | None) -> str:
    frames = [dataset, natural]
    hardware = grid.study.hardware
    started = _distinct(frames, "started_at")
    finished = _distinct(frames, "finished_at")
    generators = []
    for frame in frames:
        if frame is None:
            continue
        ok = analysis.measured(frame)
        pairs = ok[["load_generator", "load_generator_version"]].dropna(subset=["load_generator"])
        generators += [
            f"{g} {v}" if v is not pd.NA else str(g)
            for g, v in pairs.drop_duplicates().itertuples(index=False)
        ]
    rows = [
        ("hardware (study)", hardware.name or DASH),
        (
            "memory bandwidth (study)",
            f"{hardware.memory_bandwidth_gb_s} GB/s" if hardware.memory_bandwidth_gb_s else DASH,
        ),
        ("GPU", ", ".join(_distinct(frames, "gpu")) or "none detected"),
        ("driver", ", ".join(_distinct(frames, "driver")) or DASH),
        ("host", ", ".join(_distinct(frames, "hostname")) or DASH),
        ("gridbench", ", ".join(_distinct(frames, "gridbench_version")) or DASH),
        ("load generators", ", ".join(dict.fromkeys(generators)) or DASH),
        ("measured", f"{min(started)} – {max(finished)}" if started and finished else DASH),
    ]
    counts = dataset["status"].value_counts()
    cells = f"{counts.get('ok', 0)} ok, {counts.get('failed', 0)} failed, {counts.get('skipped', 0)} skipped"
    rows.append(("depth cells", cells))
    if natural is not None:
        counts = natural["status"].value_counts()
        rows.append(("natural-prompt cells", f"{counts.get('ok', 0)} ok, {counts.get('failed', 0)} failed"))
    engines = []
    ok_frames = [analysis.measured(f) for f in frames if f is not None]
    measured_rows = pd.concat(ok_frames) if ok_frames else dataset.iloc[0:0]
    keys = [
        "engine",
        "engine_label",
        "engine_kind",
        "engine_runtime",
        "image",
        "image_digest",
        "engine_version",
    ]
    for row in measured_rows[keys].drop_duplicates().itertuples(index=False):
        engines.append(
            (
                row.engine_label,
                f"{row.engine_kind} ({row.engine_runtime})",
                code(row.image),
                code(row.image_digest),
                code(row.engine_version),
            )
        )
    text = table(("", ""), rows)
    if engines:
        text += "\n\n" + table(
            ("engine", "kind (runtime)", "image", "image digest", "engine version"), engines
        )
    return text


def configs_table(grid: Grid, dataset: pd.DataFrame) -> str:
    rows = []
    meta = dataset.drop_duplicates("config")
    fingerprints = analysis.measured(dataset).drop_duplicates("config").set_index("config")["fingerprint"]
    for row in meta.itertuples():
        cfg = grid.configs.get(row.config)
        serving = DASH
        flags = DASH
        if cfg is not None:
            s = cfg.serving
            serving = (
                f"max len {s.max_model_len} · prefix cache {'on' if s.prefix_caching else 'off'} · "
                f"chunked prefill {'on' if s.chunked_prefill else 'off'} · TP {s.tensor_parallel_size}"
            )
            flags = code(" ".join(cfg.serve_args)) if cfg.serve_args else DASH
        rows.append(
            (
                code(row.config),
                row.engine_label,
                row.quantization,
                row.speculation_label,
                row.config_label,
                serving,
                flags,
                code(fingerprints.get(row.config)),
            )
        )
    return table(
        (
            "config",
            "engine",
            "checkpoint",
            "speculation",
            "label",
            "serving",
            "extra serve flags",
            "fingerprint",
        ),
        rows,
    )


# --- tables -----------------------------------------------------------------------------


def _value(cells: Mapping[tuple[str, int], Mapping[str, Any]], config: str, depth: int, column: str) -> str:
    row = cells.get((config, depth))
    if row is None:
        return DASH
    if row["status"] != "ok":
        return str(row["status"])
    return pm(Measure.of(row[column], row[f"{column}_std"]))


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
                _crossover_text(s),
            )
        )
    text = table(("config", "baseline", "best", "worst", "crossover"), summary)
    depths = sorted({p.depth for s in series for p in s.points})
    by_depth = []
    for depth in depths:
        row: list[Any] = [depth]
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


def startup_section(dataset: pd.DataFrame, natural: pd.DataFrame | None) -> str:
    starts = analysis.engine_starts([dataset, natural])
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
    rows = [
        (", ".join(code(c) for c in s.configs), s.engine_label, num(s.startup_s, 1), s.cells) for s in starts
    ]
    return (
        "Each engine start the measured cells ran on, from launch until the health path answers "
        "and the model is listed (`engine_startup_s`). Start-up is part of what a sweep costs: "
        f"{_starts(len(starts))} took {_duration(total)} in all{split}.\n\n"
        + table(("config", "engine", "cold start to healthy (s)", "measured cells on it"), rows)
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
        row: list[Any] = [depth]
        for config in configs:
            rate = cells.get((config, depth), {}).get("acceptance_rate")
            row.append(DASH if rate is None or _na(rate) else pct(float(rate)))
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
            lines.append((row["context_tokens"], cold, cached, DASH if _na(speedup) else f"{speedup:.2f}×"))
        blocks.append(
            f"### `{config}`: {mine.iloc[0]['config_label']}\n\n"
            + table(("depth", "cold TTFT (ms)", "cached TTFT (ms)", "speedup"), lines)
        )
    return "\n\n".join(blocks)


def natural_section(natural: pd.DataFrame | None) -> str:
    if natural is None:
        return "No natural-prompt cell was measured."
    blocks = []
    for config in analysis.config_order(natural):
        mine = natural[natural["config"] == config]
        rows = []
        for row in mine.to_dict("records"):
            if row["status"] != "ok":
                rows.append((row["prompt_class"], row["concurrency"], row["status"], *[DASH] * 9))
                continue
            acceptance = pct(row["acceptance_rate"]) if not _na(row["acceptance_rate"]) else DASH
            rows.append(
                (
                    row["prompt_class"],
                    row["concurrency"],
                    num(row["output_tok_s"]),
                    num(row["req_tok_s_p50"]),
                    num(row["ttft_ms_p50"], 0),
                    num(row["ttft_ms_p95"], 0),
                    num(row["tpot_ms_p50"], 1),
                    num(row["tpot_ms_p95"], 1),
                    num(row["output_tokens_p50"], 0),
                    num(row["wall_s"], 1),
                    f"{row['ok']} / {row['errored']} / {row['incomplete']}",
                    acceptance,
                )
            )
        label = mine["config_label"].iloc[0]
        block = f"### `{config}`: {label}\n\n" + table(
            (
                "class",
                "c",
                "agg tok/s",
                "per-req p50 (tok/s)",
                "TTFT p50 (ms)",
                "TTFT p95 (ms)",
                "TPOT p50 (ms)",
                "TPOT p95 (ms)",
                "median out (tokens)",
                "wall (s)",
                "ok / errored / incomplete",
                "acceptance",
            ),
            rows,
        )
        warnings = sorted(set("; ".join(mine["percentile_warnings"].dropna()).split("; ")) - {""})
        if warnings:
            block += "\n\nPercentile warnings: " + "; ".join(warnings) + "."
        blocks.append(block)
    return "\n\n".join(blocks)


def _na(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def capacity_section(natural: pd.DataFrame | None, study: StudyInfo) -> str:
    targets = capacity_targets(study)
    if not targets:
        return (
            "No latency targets set (`study.capacity.ttft_ms_p50`, `study.capacity.tpot_ms_p50`): "
            "no capacity table."
        )
    if natural is None:
        return "No natural-prompt cell was measured."
    rows = []
    for cap in analysis.capacities(natural, targets):
        best = cap.row
        miss = cap.first_miss
        rows.append(
            (
                code(cap.config),
                cap.prompt_class,
                cap.concurrency if cap.concurrency else "none",
                num(best["output_tok_s"]) if best else DASH,
                num(best["ttft_ms_p50"], 0) if best else DASH,
                num(best["tpot_ms_p50"], 1) if best else DASH,
                f"c={miss['concurrency']}: TTFT p50 {num(miss['ttft_ms_p50'], 0)} ms, "
                f"TPOT p50 {num(miss['tpot_ms_p50'], 1)} ms"
                if miss
                else "none measured",
            )
        )
    return f"Highest concurrency whose medians meet {targets_text(targets)} (`study.capacity`):\n\n" + table(
        (
            "config",
            "class",
            "highest c",
            "agg tok/s there",
            "TTFT p50 (ms)",
            "TPOT p50 (ms)",
            "lowest level that misses",
        ),
        rows,
    )


def pareto_section(natural: pd.DataFrame | None, study: StudyInfo) -> str:
    if natural is None:
        return "No natural-prompt cell was measured."
    targets = capacity_targets(study)
    points = analysis.pareto_points(natural, targets)
    frontier = sorted((p for p in points if p.on_frontier), key=lambda p: (p.prompt_class, -p.per_user_tok_s))
    if not frontier:
        return "No natural-prompt level was measured."
    meets = f"meets {targets_text(targets)}" if targets else "meets targets (none set)"
    return (
        "Every measured (config, concurrency) level is a point: per-user output tok/s (p50 over its "
        "requests) against aggregate output tok/s per GPU (the config's GPUs; 1 on a CPU). A level is "
        "on the frontier when no other level of its prompt class is at least as good on both and "
        f"better on one; from the most interactive to the most throughput ({len(frontier)} of "
        f"{len(points)} levels):\n\n"
        + table(
            (
                "class",
                "config",
                "c",
                "per-user tok/s",
                "tok/s per GPU",
                "TTFT p50 (ms)",
                "TPOT p50 (ms)",
                meets,
            ),
            (
                (
                    p.prompt_class,
                    code(p.config),
                    p.concurrency,
                    num(p.per_user_tok_s),
                    num(p.tok_s_per_gpu),
                    num(p.ttft_ms_p50, 0) if p.ttft_ms_p50 is not None else DASH,
                    num(p.tpot_ms_p50, 1) if p.tpot_ms_p50 is not None else DASH,
                    DASH if p.meets_targets is None else ("yes" if p.meets_targets else "no"),
                )
                for p in frontier
            ),
        )
    )


def failures_section(dataset: pd.DataFrame, natural: pd.DataFrame | None) -> str:
    rows = []
    for row in dataset[dataset["status"] != "ok"].to_dict("records"):
        rows.append(
            (
                code(row["config"]),
                f"depth {row['context_tokens']}",
                row["status"],
                row["reason"],
                code(row["log_path"]),
            )
        )
    cached = analysis.with_cached(dataset)
    for row in cached[cached["cached_status"] == "failed"].to_dict("records"):
        rows.append(
            (
                code(row["config"]),
                f"depth {row['context_tokens']} (cached context)",
                "failed",
                row["cached_reason"],
                code(row["cached_log_path"]),
            )
        )
    if natural is not None:
        for row in natural[natural["status"] != "ok"].to_dict("records"):
            rows.append(
                (
                    code(row["config"]),
                    f"{row['prompt_class']} c={row['concurrency']}",
                    row["status"],
                    row["reason"],
                    code(row["log_path"]),
                )
            )
    if not rows:
        return "None: every scheduled cell was measured."
    return table(("config", "cell", "status", "reason", "log"), rows)


def graphs_section(graphs: Sequence[str]) -> str:
    if not graphs:
        return "No graphs were drawn."
    blocks = []
    for link in graphs:
        name = link.rsplit("/", 1)[-1].removesuffix(".png")
        blocks.append(f"### {layout.GRAPH_TITLES.get(name, name)}\n\n![{name}]({link})")
    return "\n\n".join(blocks)


def full_data(dataset: pd.DataFrame) -> str:
    ok = analysis.measured(dataset)
    if ok.empty:
        return "No depth cell was measured."
    rows = []
    for row in ok.to_dict("records"):
        rows.append(
            (
                code(row["config"]),
                row["context_tokens"],
                pm(Measure.of(row["prefill_tps"], row["prefill_tps_std"])),
                pm(Measure.of(row["decode_tps"], row["decode_tps_std"])),
                pm(Measure.of(row["peak_tps"], row["peak_tps_std"])),
                pm(Measure.of(row["ttft_ms"], row["ttft_ms_std"])),
                pct(row["acceptance_rate"]) if not _na(row["acceptance_rate"]) else DASH,
            )
        )
    return table(
        ("config", "depth", "prefill tok/s", "decode tok/s", "peak tok/s", "TTFT (ms)", "acceptance"), rows
    )
