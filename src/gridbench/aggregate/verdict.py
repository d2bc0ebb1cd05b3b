"""The report's verdict: one line per finding, the largest effect first.

A finding is one axis of the grid (speculation, engine, quantization, context depth) with
the configs that share a conclusion merged into one line, and the evidence it rests on: the
depths, the ratios and their spread. Pure functions of the dataset frames and the study.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from gridbench.aggregate import analysis
from gridbench.aggregate.analysis import LOSS, TIE, WIN, Pattern, Speedup
from gridbench.aggregate.load import Capacity, frame_capacities
from gridbench.aggregate.phenomena import CLASS_SPREAD
from gridbench.aggregate.records import ConfigIdentity, missing
from gridbench.aggregate.text import and_list, num, pct, pm, ratio_text, span
from gridbench.config.grid import StudyInfo

MARKS = {WIN: "faster", LOSS: "slower", TIE: "tie"}
# how many configs a line names before it counts them instead
NAMED = 4


def speculation_family(config: ConfigIdentity) -> str:
    """The speculation label without its draft length ("DFlash n=8" -> "DFlash"), so that
    draft lengths of one method share a line."""
    draft_length = config.num_speculative_tokens
    if draft_length is None:
        return config.speculation_label
    return re.sub(rf"\s+\w+\s*=\s*{draft_length}$", "", config.speculation_label)


def pair_label(config: ConfigIdentity) -> str:
    """How a config reads in an engine pair: its engine and quantization, and its
    speculation when it speculates (e.g. "vLLM BF16 + ngram n=8")."""
    label = f"{config.engine_label} {config.quantization}"
    return label if config.speculation_method == "none" else f"{label} + {config.speculation_label}"


def configs_by_name(dataset: pd.DataFrame) -> dict[str, ConfigIdentity]:
    return {config.config: config for config in analysis.config_identities(dataset)}


@dataclass(frozen=True)
class Finding:
    effect: float  # the largest fold the line rests on: the verdict's order, largest first
    text: str


def verdict_lines(
    dataset: pd.DataFrame,
    natural: pd.DataFrame | None,
    study: StudyInfo,
) -> list[str]:
    if analysis.measured(dataset).empty:
        lines = ["No depth cell was measured: there is nothing to compare."]
    else:
        meta = configs_by_name(dataset)
        ranked = (
            speculation_findings(dataset, study, meta)
            + engine_findings(dataset, meta)
            + quantization_findings(dataset, meta)
            + depth_findings(dataset)
        )
        lines = [f.text for f in sorted(ranked, key=lambda f: f.effect, reverse=True)]
        lines += roofline_findings(dataset, study, meta)
    if natural is not None:
        lines += natural_findings(natural, study)
    failed = sum(int((f["status"] == "failed").sum()) for f in (dataset, natural) if f is not None)
    if failed:
        cells = "1 cell" if failed == 1 else f"{failed} cells"
        lines.append(f"{cells} failed; every statement here uses measured cells only.")
    return lines


# --- shared wording ---------------------------------------------------------------------


def runs_text(s: Speedup) -> str:
    return ", ".join(f"{MARKS[o]} {span(a, b)}" if a != b else f"{MARKS[o]} at {a}" for o, a, b in s.runs())


def where_text(p: Pattern, series: Sequence[Speedup]) -> str:
    """Where along the depth axis a config is faster, in words a user acts on: "only below 12k
    of context (faster 0–8192, slower 12288–65536)"."""
    depths = sorted({point.depth for s in series for point in s.points})
    measured = span(depths[0], depths[-1])
    every = "at the one depth measured" if len(depths) == 1 else "at every depth measured"
    runs = {runs_text(s) for s in series}
    # members that share a conclusion can still differ in where a tie falls: each then says its own
    runs_shown = runs.pop() if len(runs) == 1 else "; ".join(f"{s.config} {runs_text(s)}" for s in series)
    if p.kind == analysis.PAYS_EVERYWHERE:
        return f"{every} ({measured})"
    if p.kind == analysis.TIES_EVERYWHERE:
        return f"at no depth beyond the runs' spread ({measured})"
    if p.kind == analysis.LOSES_EVERYWHERE:
        return f"at no depth measured ({runs_shown})"
    if p.kind == analysis.PAYS_BELOW and p.boundary is not None:
        return f"only below {analysis.short_depth(p.boundary)} of context ({runs_shown})"
    if p.kind == analysis.PAYS_FROM and p.boundary is not None:
        return f"only from {analysis.short_depth(p.boundary)} of context on ({runs_shown})"
    return f"at some depths only ({runs_shown})"


def range_text(series: Sequence[Speedup], name_configs: bool) -> str:
    """The lowest and the highest ratio with their spread and depth: "0.43 ± 0.09× at 0 to
    0.92 ± 0.03× at 65536", naming each one's config when ``name_configs``."""
    points = [(s.config, p) for s in series for p in s.points]
    low = min(points, key=lambda item: item[1].speedup.mean)
    high = max(points, key=lambda item: item[1].speedup.mean)

    def one(item: tuple[str, analysis.SpeedupPoint]) -> str:
        config, point = item
        if name_configs:
            return f"{ratio_text(point.speedup)} ({config} at {point.depth})"
        return f"{ratio_text(point.speedup)} at {point.depth}"

    return one(low) if low == high else f"{one(low)} to {one(high)}"


def names(configs: Sequence[str], total: int | None = None) -> str:
    if len(configs) > NAMED:
        return f"{len(configs)} of {total} configs" if total else f"{len(configs)} configs"
    return and_list(list(configs))


def _grouped(items: Sequence[Speedup], key: Callable[[Speedup], Hashable]) -> dict[Any, list[Speedup]]:
    """Comparisons by what they share, in their first one's order."""
    groups: dict[Any, list[Speedup]] = {}
    for s in items:
        groups.setdefault(key(s), []).append(s)
    return groups


# --- speculation ------------------------------------------------------------------------


def speculation_findings(
    dataset: pd.DataFrame, study: StudyInfo, meta: Mapping[str, ConfigIdentity]
) -> list[Finding]:
    """One line per speculation method and conclusion, its draft lengths and configs merged."""
    series = [s for s in analysis.speedups(dataset, study) if s.points]
    groups = _grouped(series, lambda s: (speculation_family(meta[s.config]), analysis.pattern(s)))
    findings = []
    for (family, p), members in groups.items():
        configs = [s.config for s in members]
        labels = list(dict.fromkeys(meta[c].speculation_label for c in configs))
        if len(labels) == 1:
            who = f"{labels[0]} ({names(configs)})"
        else:
            who = f"{family} " + and_list(
                [f"{meta[c].speculation_label.removeprefix(family).strip()} ({c})" for c in configs]
            )
        plural = len(members) > 1
        distinct = list(dict.fromkeys(s.baseline for s in members))
        baselines = f"their baselines ({and_list(distinct)})" if len(distinct) > 1 else distinct[0]
        if p.kind == analysis.LOSES_EVERYWHERE:
            if all(point.outcome == LOSS for s in members for point in s.points):
                everywhere = where_text(Pattern(analysis.PAYS_EVERYWHERE), members)
                claim = f"{'lose' if plural else 'loses'} to {baselines} {everywhere}"
            else:
                where = where_text(p, members).removeprefix("at no depth measured ")
                claim = f"never {'pay' if plural else 'pays'} off over {baselines} {where}"
        elif p.kind == analysis.TIES_EVERYWHERE:
            claim = f"{'make' if plural else 'makes'} no difference to {baselines} " + where_text(
                p, members
            ).removeprefix("at no depth ")
        else:
            claim = f"{'pay' if plural else 'pays'} off over {baselines} " + where_text(p, members)
        text = f"{who} {claim}: {range_text(members, plural)}"
        if p.kind == analysis.LOSES_EVERYWHERE:
            text += "; don't use it here"
        findings.append(Finding(max(analysis.fold(s) for s in members), text + "."))
    return findings


# --- engines on the same weights ----------------------------------------------------------


def _flipped(s: Speedup) -> Speedup:
    points = tuple(
        analysis.SpeedupPoint(
            p.depth,
            p.baseline,
            p.config,
            p.baseline.ratio(p.config),
            {WIN: LOSS, LOSS: WIN}.get(p.outcome, TIE),
        )
        for p in s.points
    )
    return Speedup(s.baseline, s.config, points)


def engine_findings(dataset: pd.DataFrame, meta: Mapping[str, ConfigIdentity]) -> list[Finding]:
    """One line per pair of engines, read from the engine that wins more of the depths; the
    pairs that tie at every depth share one line."""
    comparisons = [c for c in analysis.engine_comparisons(dataset) if c.points]
    ties = [c for c in comparisons if c.all_tie]
    by_engines = _grouped(
        [c for c in comparisons if not c.all_tie],
        lambda c: (meta[c.config].engine_label, meta[c.baseline].engine_label),
    )
    findings = []
    for members in by_engines.values():
        wins = sum(p.outcome == WIN for c in members for p in c.points)
        losses = sum(p.outcome == LOSS for c in members for p in c.points)
        if losses > wins:
            members = [_flipped(c) for c in members]
        fast, slow = meta[members[0].config].engine_label, meta[members[0].baseline].engine_label
        parts = []
        for p, group in _grouped(members, analysis.pattern).items():
            pairs = and_list(
                [
                    f"{_engine_pair(meta[c.config], meta[c.baseline])} ({range_text([c], False)})"
                    for c in group
                ]
            )
            where = where_text(p, group)
            if p.kind == analysis.LOSES_EVERYWHERE and all(
                pt.outcome == LOSS for c in group for pt in c.points
            ):
                where = "slower " + where_text(Pattern(analysis.PAYS_EVERYWHERE), group)
            parts.append(f"{where} for {pairs}")
        findings.append(
            Finding(
                max(analysis.fold(c) for c in members),
                f"{fast} decodes faster than {slow} on the same weights " + "; ".join(parts) + ".",
            )
        )
    if ties:
        tied = [
            f"{pair_label(meta[c.config])} and {pair_label(meta[c.baseline])} "
            f"({span(c.points[0].depth, c.points[-1].depth)})"
            for c in ties
        ]
        findings.append(
            Finding(
                1.0,
                "Engines tie on decode at every depth both measured, within the runs' spread: "
                + "; ".join(tied)
                + ".",
            )
        )
    return findings


def _engine_pair(a: ConfigIdentity, b: ConfigIdentity) -> str:
    same = a.quantization == b.quantization
    text = a.quantization if same else f"{a.quantization} over {b.quantization}"
    return text if a.speculation_method == "none" else f"{text} + {a.speculation_label}"


# --- quantization -----------------------------------------------------------------------


def quantization_findings(dataset: pd.DataFrame, meta: Mapping[str, ConfigIdentity]) -> list[Finding]:
    """Every quantization over its reference precision, one line."""
    comparisons = [c for c in analysis.quantization_comparisons(dataset) if c.points]
    if not comparisons:
        return []
    weights = dataset.drop_duplicates("config").set_index("config")["active_weight_gb"]
    groups = _grouped(
        comparisons,
        lambda c: (meta[c.config].quantization, meta[c.baseline].quantization, analysis.pattern(c)),
    )
    clauses = []
    for (quantized, reference, p), members in groups.items():
        engines = and_list(list(dict.fromkeys(meta[c.config].engine_label for c in members)))
        clause = (
            f"{quantized} decodes faster than {reference} on {engines} {where_text(p, members)}, "
            f"{range_text(members, len(members) > 1)}"
        )
        shares = sorted(
            float(weights[c.config]) / float(weights[c.baseline])
            for c in members
            if not missing(weights[c.config]) and not missing(weights[c.baseline])
        )
        if shares:
            share = (
                f"{shares[0]:.2f}"
                if f"{shares[0]:.2f}" == f"{shares[-1]:.2f}"
                else f"{shares[0]:.2f}–{shares[-1]:.2f}"
            )
            clause += f", reading {share}× the bytes per token"
        if len(members) == 1:
            clause += f" ({members[0].config} ÷ {members[0].baseline})"
        clauses.append(clause)
    return [
        Finding(
            max(analysis.fold(c) for c in comparisons),
            "Quantization, without speculation: " + "; ".join(clauses) + ".",
        )
    ]


# --- context depth ----------------------------------------------------------------------


def depth_findings(dataset: pd.DataFrame) -> list[Finding]:
    costs = analysis.depth_costs(dataset)
    if not costs:
        return []
    low = min(costs, key=lambda c: c.kept)
    high = max(costs, key=lambda c: c.kept)
    firsts, lasts = {c.first_depth for c in costs}, {c.last_depth for c in costs}
    where = (
        f"from depth {firsts.pop()} to {lasts.pop()}"
        if len(firsts) == 1 and len(lasts) == 1
        else "from each config's shallowest to its deepest depth"
    )

    def kept(c: analysis.DepthCost) -> str:
        return f"{pct(c.kept)} ({c.config}, {pm(c.first_decode)} → {pm(c.last_decode)} tok/s)"

    text = (
        f"Context depth: {where}, decode keeps "
        + (kept(low) if low is high else f"{kept(low)} to {kept(high)}")
        + " of its rate"
    )
    ttfts = [(c, c.last_ttft_ms) for c in costs if c.last_ttft_ms is not None]
    if ttfts:
        fastest, fastest_ttft = min(ttfts, key=lambda pair: pair[1].mean)
        slowest, slowest_ttft = max(ttfts, key=lambda pair: pair[1].mean)
        text += (
            f"; TTFT there is {num(fastest_ttft.mean)} ms ({fastest.config}) to "
            f"{num(slowest_ttft.mean)} ms ({slowest.config})"
        )
    return [Finding(1 / low.kept if low.kept > 0 else float("inf"), text + ".")]


# --- roofline ---------------------------------------------------------------------------


def roofline_findings(
    dataset: pd.DataFrame, study: StudyInfo, meta: Mapping[str, ConfigIdentity]
) -> list[str]:
    bandwidth = study.hardware.memory_bandwidth_gb_s
    lines = analysis.rooflines(dataset, bandwidth)
    parts = []
    for kind, group in (
        ("without speculation", [r for r in lines if meta[r.config].speculation_method == "none"]),
        ("with speculation", [r for r in lines if meta[r.config].speculation_method != "none"]),
    ):
        if not group:
            continue
        low = min(group, key=lambda r: r.realised)
        high = max(group, key=lambda r: r.realised)
        extent = (
            f"{pct(low.realised)} ({low.config}, {num(low.decode.mean)} of {num(low.ceiling_tok_s)} tok/s)"
            if low is high
            else f"{pct(low.realised)} ({low.config}) to {pct(high.realised)} ({high.config}, "
            f"{num(high.decode.mean)} of {num(high.ceiling_tok_s)} tok/s)"
        )
        parts.append(f"{extent} {kind}")
    if not parts:
        return []
    return [
        f"Of the bandwidth roofline ({bandwidth} GB/s ÷ active weights per token), decode at depth "
        f"{lines[0].depth} realises {' and '.join(parts)}."
    ]


# --- natural prompts --------------------------------------------------------------------


def capacity_targets(study: StudyInfo) -> dict[str, float]:
    return {k: float(v) for k, v in asdict(study.capacity).items() if v is not None}


def targets_text(targets: Mapping[str, float]) -> str:
    labels = {"ttft_ms_p50": "TTFT p50", "tpot_ms_p50": "TPOT p50"}
    return " and ".join(f"{labels.get(k, k)} ≤ {num(v)} ms" for k, v in targets.items())


def natural_findings(natural: pd.DataFrame, study: StudyInfo) -> list[str]:
    ok = analysis.measured(natural).dropna(subset=["output_tok_s"])
    lines = []
    if not ok.empty:
        best = ok.sort_values("output_tok_s", ascending=False, kind="stable").iloc[0]
        lines.append(
            f"Highest natural-prompt aggregate throughput: {best['config']} on {best['prompt_class']} "
            f"at c={best['concurrency']}, {num(best['output_tok_s'])} tok/s."
        )
        short = _short_outputs(ok)
        if short:
            lines.append(
                "Answers stop short of max_tokens for "
                + ", ".join(
                    f"{cls} (median {tokens} of {limit} tokens{eos})" for cls, tokens, limit, eos in short
                )
                + ": those levels measure short answers and prompt processing more than steady-state decode."
            )
        lines += class_acceptance_lines(natural)
    targets = capacity_targets(study)
    if targets:
        line = capacity_line(natural, targets)
        if line:
            lines.append(line)
        lines += pareto_lines(natural, targets)
    return lines


def pareto_lines(natural: pd.DataFrame, targets: Mapping[str, float]) -> list[str]:
    """Per prompt class, the frontier level with the most throughput per GPU that meets the
    targets: the config to serve for them."""
    points = analysis.pareto_points(natural, targets)
    lines = []
    for prompt_class, best in analysis.best_under_targets(points).items():
        frontier = [p for p in points if p.prompt_class == prompt_class and p.on_frontier]
        on = "on the frontier" if best.on_frontier else "off the frontier: the levels that beat it miss them"
        others = sorted({p.config for p in frontier} - {best.config})
        rest = f"; the frontier also has {and_list(others)}" if others else ""
        lines.append(
            f"To serve {prompt_class} under {targets_text(targets)}: {best.config} at c={best.concurrency}, "
            f"{num(best.tok_s_per_gpu)} tok/s per GPU at {num(best.per_user_tok_s)} tok/s per user "
            f"({on}{rest})."
        )
    return lines


def capacity_line(natural: pd.DataFrame, targets: Mapping[str, float]) -> str:
    """Per prompt class, the configs grouped by the highest concurrency they sustain, the
    most capable first; a config that misses at a lower level than one it meets is named."""
    ok = analysis.measured(natural)
    measured = set(zip(ok["config"], ok["prompt_class"], strict=True))
    by_class: dict[str, list[analysis.Capacity]] = {}
    for cap in analysis.capacities(natural, targets):
        if (cap.config, cap.prompt_class) in measured:  # failed or never ran: nothing is known
            by_class.setdefault(cap.prompt_class, []).append(cap)
    clauses = []
    for prompt_class, caps in by_class.items():
        levels: dict[int, list[str]] = {}
        for cap in caps:
            levels.setdefault(cap.concurrency or 0, []).append(cap.config)
        total = len(caps)
        highest = int(ok[ok["prompt_class"] == prompt_class]["concurrency"].max())
        if len(levels) == 1:
            level = next(iter(levels))
            top = ", the highest level measured" if level == highest else ""
            clause = (
                f"on {prompt_class}, all {total} configs sustain c={level}{top}"
                if level
                else f"on {prompt_class}, none of the {total} configs at any level"
            )
        else:
            parts = [
                f"{names(configs, total)} c={level}" if level else f"{names(configs, total)} no level"
                for level, configs in sorted(levels.items(), reverse=True)
            ]
            verb = "sustains" if len(levels[max(levels)]) == 1 else "sustain"
            first, *rest = parts
            clause = f"on {prompt_class}, " + first.replace(" c=", f" {verb} c=", 1)
            clause += f" and {and_list(rest)}" if rest else ""
        gaps = [
            f"{cap.config} misses them at c={cap.first_miss.concurrency} "
            f"(TTFT p50 {num(cap.first_miss.ttft_ms_p50, 0)} ms, "
            f"TPOT p50 {num(cap.first_miss.tpot_ms_p50, 1)} ms)"
            for cap in caps
            if cap.concurrency and cap.first_miss and cap.first_miss.concurrency < cap.concurrency
        ]
        if gaps:
            clause += ", though " + and_list(gaps)
        clauses.append(clause)
    if not clauses:
        return ""
    return f"Under {targets_text(targets)}: " + "; ".join(clauses) + "."


def _short_outputs(ok: pd.DataFrame) -> list[tuple[str, int, int, str]]:
    """Classes whose answers stop short: a median output under half of max_tokens, or a
    quarter of the requests or more ended on the model's own EOS; with how many did, where
    the rows say (", 8 of 8 ended on EOS")."""
    result = []
    for prompt_class, group in ok.groupby("prompt_class", sort=False):
        limit = group["max_tokens"].dropna()
        tokens = group["output_tokens_p50"].dropna()
        if limit.empty or tokens.empty:
            continue
        median = int(tokens.median())
        eos = group["ended_on_eos"].dropna() if "ended_on_eos" in group else pd.Series()
        counted = int(group.loc[eos.index, "ok"].sum())
        # a quarter of answers ending early already pulls the class's tok/s toward prompt processing
        often_eos = counted > 0 and int(eos.sum()) >= counted / 4
        if median < 0.5 * int(limit.max()) or often_eos:
            ended = f", {int(eos.sum())} of {counted} ended on EOS" if not eos.empty else ""
            result.append((str(prompt_class), median, int(limit.max()), ended))
    return result


def class_acceptance_lines(natural: pd.DataFrame) -> list[str]:
    """Per speculative config, at its lowest level measured on several classes, how far
    acceptance moves with the prompt class (when by CLASS_SPREAD or more)."""
    lines = []
    lowest: dict[str, int] = {}
    spreads = analysis.acceptance_spread(analysis.class_acceptance(natural))
    for config, concurrency in spreads:
        lowest[config] = min(concurrency, lowest.get(config, concurrency))
    for config, concurrency in lowest.items():
        levels = spreads[(config, concurrency)]
        high, low = levels[0], levels[-1]
        if (high.acceptance_rate or 0.0) - (low.acceptance_rate or 0.0) < CLASS_SPREAD:
            continue
        lines.append(
            f"Acceptance depends on the prompt class: {config} at c={concurrency} accepts "
            f"{pct(high.acceptance_rate or 0.0)} of drafted tokens on {high.prompt_class} but "
            f"{pct(low.acceptance_rate or 0.0)} on {low.prompt_class}; quote its speed with the workload."
        )
    return lines


# --- open-loop load ---------------------------------------------------------------------


@dataclass(frozen=True)
class SloWords:
    """The SLO the load dataset was judged by, as the report says it."""

    targets: str  # "TTFT ≤ 2000 ms and TPOT ≤ 100 ms"
    attainment: str  # "90 %"
    percentile: int  # the percentile the dataset reports against the targets

    def __str__(self) -> str:
        return f"{self.targets} for ≥ {self.attainment} of requests"


def slo_words(load: pd.DataFrame) -> SloWords | None:
    """None when no load cell was measured."""
    judged = load[load["status"] == "ok"]
    if judged.empty:
        return None
    row = judged.iloc[0]
    return SloWords(
        f"TTFT ≤ {num(row['slo_ttft_ms'])} ms and TPOT ≤ {num(row['slo_tpot_ms'])} ms",
        pct(float(row["slo_attainment_required"])),
        int(row["slo_percentile"]),
    )


def capacity_text(cap: Capacity) -> str:
    """ "4 req/s", or "at least 4 req/s" where no measured rate above it failed."""
    if cap.capacity_req_s is None:
        return "meets it at no rate measured"
    rate = f"{cap.capacity_req_s:g} req/s"
    return rate if cap.first_failing_req_s is not None else f"at least {rate}"


def load_findings(load: pd.DataFrame) -> list[str]:
    """Per prompt class and arrival process, the config that serves the most load under the
    SLO (the highest passing rate, then the most goodput there), and the others after it."""
    slo = slo_words(load)
    if slo is None:
        return ["No load cell was measured: no capacity under the SLO."] if not load.empty else []
    groups: dict[tuple[str, str], list[Capacity]] = {}
    for cap in frame_capacities(load):
        groups.setdefault((cap.prompt_class, cap.arrival), []).append(cap)
    lines = []
    for (prompt_class, arrival), caps in groups.items():
        ranked = sorted(caps, key=lambda c: (c.capacity_req_s or 0.0, c.goodput_tok_s or 0.0), reverse=True)
        best, rest = ranked[0], ranked[1:]
        if best.capacity_req_s is None:
            lines.append(
                f"Under the SLO ({slo}), {prompt_class} at {arrival} arrivals: no config meets it "
                "at any rate measured."
            )
            continue
        text = (
            f"Most load under the SLO ({slo}), {prompt_class} at {arrival} arrivals: {best.config}, "
            f"{capacity_text(best)} ({num(best.goodput_req_s)} req/s, {num(best.goodput_tok_s)} tok/s "
            f"of goodput; {best.binding_constraint or 'no'} target binding)"
        )
        if rest:
            text += "; then " + and_list([f"{c.config} {capacity_text(c)}" for c in rest])
        lines.append(text + ".")
    return lines
