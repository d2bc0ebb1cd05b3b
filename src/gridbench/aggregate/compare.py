"""One study against another: what got faster or slower, per matched config and depth.

Configs match by name, else (a renamed config) by what they serve: engine kind, quantization,
speculation method and draft length, when exactly one config on each side has them. Two
values differ only under the report's tie rule (|a − b| > √(sa² + sb²)); a difference is a
regression when it is worse and beyond the threshold, and so is a cell that was measured
before and failed after. ``compare_studies`` and ``render_comparison`` are pure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from gridbench.aggregate.analysis import TIE, WIN, Measure, cell_index, rows
from gridbench.aggregate.quality import TOKENS
from gridbench.aggregate.records import Row, missing, number

BETTER, WORSE = "better", "worse"
# what a renamed config must share with its counterpart to be compared
LABEL_MATCH = ("engine_kind", "weights", "quantization", "speculation_method", "num_speculative_tokens")


@dataclass(frozen=True)
class ComparedMetric:
    label: str
    column: str
    unit: str
    higher_is_better: bool
    # measured only by some cells (the prefix-cache pass's depths): absent on both sides is no gap
    only_some_cells: bool = False


METRICS = (
    ComparedMetric("decode", "decode_tps", "tok/s", True),
    ComparedMetric("prefill", "prefill_tps", "tok/s", True),
    ComparedMetric("TTFT", "ttft_ms", "ms", False),
    # the prefix-cache pass's cells (benchy.prefix_cache_pass), where a study has them
    ComparedMetric("cached TTFT", "ttft_ms_cached", "ms", False, only_some_cells=True),
)


@dataclass(frozen=True)
class ConfigMatch:
    before: str
    after: str
    by: str  # "name" or "what it serves"


@dataclass(frozen=True)
class CellChange:
    config: str  # the name after
    depth: int
    metric: ComparedMetric
    before: Measure
    after: Measure
    ratio: Measure  # after / before
    outcome: str  # better, worse or tie

    def regresses(self, threshold: float) -> bool:
        if self.outcome != WORSE:
            return False
        change = self.ratio.mean - 1 if self.metric.higher_is_better else 1 - self.ratio.mean
        return change < -threshold


@dataclass(frozen=True)
class CellGap:
    """A matched cell that cannot be compared: failed or missing on one side."""

    config: str
    depth: int
    before_status: str
    after_status: str
    reason: str

    @property
    def regresses(self) -> bool:
        return self.before_status == "ok" and self.after_status != "ok"


@dataclass(frozen=True)
class UnmeasuredValue:
    """A metric of a cell that ran in both studies but has no value in one or both (llama-benchy
    leaves prefill null when its latency estimate exceeds the time to first response)."""

    config: str
    depth: int
    metric: ComparedMetric
    missing_in: tuple[str, ...]  # "before", "after" or both


@dataclass(frozen=True)
class StudyComparison:
    threshold: float
    metrics: tuple[ComparedMetric, ...]  # those either study measured
    matches: tuple[ConfigMatch, ...]
    changes: tuple[CellChange, ...]
    gaps: tuple[CellGap, ...]
    unmeasured: tuple[UnmeasuredValue, ...]
    only_before: tuple[str, ...]
    only_after: tuple[str, ...]
    quality: QualityComparison | None = None  # where both studies have a quality dataset

    @property
    def regressions(self) -> tuple[CellChange, ...]:
        return tuple(c for c in self.changes if c.regresses(self.threshold))

    @property
    def lost_cells(self) -> tuple[CellGap, ...]:
        return tuple(g for g in self.gaps if g.regresses)

    @property
    def quality_regressions(self) -> tuple[QualityChange, ...]:
        return self.quality.regressions if self.quality else ()

    @property
    def regressed(self) -> bool:
        return bool(self.regressions or self.lost_cells or self.quality_regressions)


def _value(value: object) -> object:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def match_configs(before: pd.DataFrame, after: pd.DataFrame) -> list[ConfigMatch]:
    """Same name first; then a config left on each side that serves the same thing."""
    names_before = list(dict.fromkeys(before["config"]))
    names_after = list(dict.fromkeys(after["config"]))
    matches = [ConfigMatch(name, name, "name") for name in names_after if name in names_before]
    left_before = [n for n in names_before if n not in names_after]
    left_after = [n for n in names_after if n not in names_before]

    def keys(frame: pd.DataFrame, names: Sequence[str]) -> dict[tuple[object, ...], list[str]]:
        rows = frame.drop_duplicates("config").set_index("config")
        found: dict[tuple[object, ...], list[str]] = {}
        for name in names:
            key = tuple(_value(rows.at[name, column]) if column in rows else None for column in LABEL_MATCH)
            found.setdefault(key, []).append(name)
        return found

    keys_before = keys(before, left_before)
    for key, names in keys(after, left_after).items():
        counterparts = keys_before.get(key, [])
        if len(names) == 1 and len(counterparts) == 1:
            matches.append(ConfigMatch(counterparts[0], names[0], "what it serves"))
    return matches


def _outcome(metric: ComparedMetric, before: Measure, after: Measure) -> str:
    versus = after.versus(before)
    if versus == TIE:
        return TIE
    return BETTER if (versus == WIN) == metric.higher_is_better else WORSE


def compare_studies(
    before: pd.DataFrame,
    after: pd.DataFrame,
    threshold: float = 0.05,
    quality: QualityComparison | None = None,
) -> StudyComparison:
    """``after`` against ``before`` (two depth datasets) at every matched (config, depth);
    ``quality``, the two studies' quality datasets compared, joins their verdict."""
    matches = match_configs(before, after)
    cells_before, cells_after = cell_index(before), cell_index(after)
    metrics = tuple(
        m for m in METRICS if any(m.column in f and f[m.column].notna().any() for f in (before, after))
    )
    changes: list[CellChange] = []
    gaps: list[CellGap] = []
    unmeasured: list[UnmeasuredValue] = []
    for match in matches:
        depths = sorted(
            {d for c, d in cells_before if c == match.before}
            | {d for c, d in cells_after if c == match.after}
        )
        for depth in depths:
            cell_before = cells_before.get((match.before, depth))
            cell_after = cells_after.get((match.after, depth))
            status_before = cell_before.status if cell_before else "absent"
            status_after = cell_after.status if cell_after else "absent"
            if cell_before is None or cell_after is None or status_before != "ok" or status_after != "ok":
                failed = cell_after if status_after not in ("ok", "absent") else cell_before
                reason = (failed.reason if failed else None) or "not in that study's grid"
                gaps.append(CellGap(match.after, depth, status_before, status_after, reason))
                continue
            for metric in metrics:
                a = cell_before.measure(metric.column)
                b = cell_after.measure(metric.column)
                if a is None and b is None and metric.only_some_cells:
                    continue
                if a is None or b is None or a.mean <= 0:
                    missing = (("before",) if a is None or a.mean <= 0 else ()) + (
                        ("after",) if b is None else ()
                    )
                    unmeasured.append(UnmeasuredValue(match.after, depth, metric, missing))
                    continue
                changes.append(
                    CellChange(match.after, depth, metric, a, b, b.ratio(a), _outcome(metric, a, b))
                )
    matched_before = {m.before for m in matches}
    matched_after = {m.after for m in matches}
    return StudyComparison(
        threshold=threshold,
        metrics=metrics,
        matches=tuple(matches),
        changes=tuple(changes),
        gaps=tuple(gaps),
        unmeasured=tuple(unmeasured),
        only_before=tuple(c for c in dict.fromkeys(before["config"]) if c not in matched_before),
        only_after=tuple(c for c in dict.fromkeys(after["config"]) if c not in matched_after),
        quality=quality,
    )


# --- quality: the quality datasets, where both studies have one --------------------------


@dataclass(frozen=True)
class QualityAgreement:
    """A config's greedy agreement with its reference in one study."""

    reference: str
    match_pct: float  # positions matching, in ``unit``
    unit: str
    # beyond near-ties of the baseline (quality.NEAR_TIE_NATS); None: not speculative, or
    # no baseline result
    lossless_mismatches: int | None
    kl_mean: float | None  # teacher-forced KL from the reference, nats per token; None: no pass

    @classmethod
    def of(cls, row: Row) -> QualityAgreement | None:
        unit = str(row["agreement_unit"])
        match = row["token_match_pct"] if unit == TOKENS else row["char_match_pct"]
        if row["status"] != "ok" or missing(match):
            return None
        # a dataset written before near-ties were told apart counts every mismatch
        mismatches = row.get("lossless_mismatches_beyond_ties", row["lossless_mismatches"])
        kl = row.get("kl_divergence_mean")
        return cls(
            str(row["reference"]),
            number(match),
            unit,
            None if missing(mismatches) else int(number(mismatches)),
            None if kl is None or missing(kl) else number(kl),
        )


@dataclass(frozen=True)
class QualityChange:
    config: str  # the name after
    before: QualityAgreement
    after: QualityAgreement

    @property
    def change_pp(self) -> float:
        return self.after.match_pct - self.before.match_pct

    @property
    def lost_losslessness(self) -> bool:
        return self.before.lossless_mismatches == 0 and bool(self.after.lossless_mismatches)

    @property
    def kl_rise(self) -> float | None:
        """How much further the config's probabilities are from its reference's (nats per
        token); None where a study made no teacher-forced pass."""
        if self.before.kl_mean is None or self.after.kl_mean is None:
            return None
        return self.after.kl_mean - self.before.kl_mean

    def regresses(self, threshold_pp: float, kl_threshold: float) -> bool:
        kl_rise = self.kl_rise
        further = kl_rise is not None and kl_rise > kl_threshold
        return self.change_pp < -threshold_pp or self.lost_losslessness or further


@dataclass(frozen=True)
class QualityComparison:
    threshold_pp: float
    kl_threshold: float  # nats per token
    changes: tuple[QualityChange, ...]

    @property
    def regressions(self) -> tuple[QualityChange, ...]:
        return tuple(c for c in self.changes if c.regresses(self.threshold_pp, self.kl_threshold))


def compare_quality(
    before: pd.DataFrame, after: pd.DataFrame, threshold_pp: float, kl_threshold: float
) -> QualityComparison:
    """Every matched config with agreement numbers in both studies, in ``after``'s order."""
    by_config_before = {str(r["config"]): QualityAgreement.of(r) for r in rows(before)}
    by_config_after = {str(r["config"]): QualityAgreement.of(r) for r in rows(after)}
    changes = []
    for match in match_configs(before, after):
        a, b = by_config_before.get(match.before), by_config_after.get(match.after)
        if a is not None and b is not None and a.unit == b.unit:
            changes.append(QualityChange(match.after, a, b))
    return QualityComparison(threshold_pp, kl_threshold, tuple(changes))


def _lossless(agreement: QualityAgreement) -> str:
    if agreement.lossless_mismatches is None:
        return "—"
    return "yes" if agreement.lossless_mismatches == 0 else f"no ({agreement.lossless_mismatches} differ)"


def _kl(agreement: QualityAgreement) -> str:
    return "—" if agreement.kl_mean is None else f"{agreement.kl_mean:.4f}"


def quality_lines(comparison: QualityComparison, before_name: str, after_name: str) -> list[str]:
    """compare.md's quality section."""
    lines = ["", "## Quality", ""]
    if not comparison.changes:
        return [*lines, "No config has quality results in both studies.", ""]
    lines += [
        f"Positions of each config's greedy output that match its reference's, in {before_name} "
        f"and {after_name}, and the teacher-forced KL divergence from it (nats per token); a "
        f"regression is a drop of more than {comparison.threshold_pp:g} percentage points, a KL "
        f"higher by more than {comparison.kl_threshold:g}, or a speculative config that was "
        "lossless and no longer is.",
        "",
        f"| config | reference | {before_name} | {after_name} | change | KL {before_name} | KL {after_name} "
        "| lossless before | lossless after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in comparison.changes:
        mark = " **regression**" if c.regresses(comparison.threshold_pp, comparison.kl_threshold) else ""
        lines.append(
            f"| `{c.config}` | `{c.after.reference}` | {c.before.match_pct:.1f} % "
            f"| {c.after.match_pct:.1f} % | {c.change_pp:+.1f} pp{mark} | {_kl(c.before)} | {_kl(c.after)} "
            f"| {_lossless(c.before)} | {_lossless(c.after)} |"
        )
    return [*lines, ""]


def _fmt(measure: Measure) -> str:
    digits = 0 if abs(measure.mean) >= 100 else 1
    return f"{measure.mean:.{digits}f} ± {measure.std:.{digits}f}"


def _change_line(change: CellChange) -> str:
    return (
        f"`{change.config}` at depth {change.depth}: {change.metric.label} {_fmt(change.before)} → "
        f"{_fmt(change.after)} {change.metric.unit} ({change.ratio.mean:.2f} ± {change.ratio.std:.2f}×)"
    )


def render_comparison(
    comparison: StudyComparison, before_name: str, after_name: str, graph_links: Sequence[str] = ()
) -> str:
    """The comparison as markdown: verdict, what changed beyond the tie rule, every cell."""
    lines = [f"# {after_name} against {before_name}", ""]
    lines += _verdict_section(comparison)
    lines += _method_section(comparison, before_name, after_name)
    lines += _regressions_section(comparison, before_name, after_name)
    lines += _improvements_section(comparison)
    if comparison.quality is not None:
        lines += quality_lines(comparison.quality, before_name, after_name)
    lines += _every_cell_section(comparison, before_name, after_name)
    lines += _not_compared_section(comparison, before_name, after_name)
    for link in graph_links:
        lines += [f"![{link}]({link})", ""]
    return "\n".join(lines)


def _verdict_section(comparison: StudyComparison) -> list[str]:
    threshold = f"{comparison.threshold:.0%}"
    lines = ["## Verdict", ""]
    if comparison.quality_regressions:
        lines.append(
            f"- **Quality regression**: {len(comparison.quality_regressions)} config(s) further from their "
            "reference than before (see Quality)."
        )
    if not comparison.matches:
        lines.append("- No config of one study matches a config of the other: nothing to compare.")
    elif comparison.regressions or comparison.lost_cells:
        lines.append(
            f"- **Regression**: {len(comparison.regressions)} measure(s) worse by more than {threshold} "
            f"beyond their spread, {len(comparison.lost_cells)} cell(s) measured before and failed or "
            "missing after."
        )
    elif not comparison.quality_regressions:
        lines.append(f"- No regression: nothing is worse by more than {threshold} beyond its spread.")
    for metric in comparison.metrics:
        counts = {o: 0 for o in (BETTER, WORSE, TIE)}
        for change in comparison.changes:
            if change.metric == metric:
                counts[change.outcome] += 1
        if sum(counts.values()):
            lines.append(
                f"- {metric.label}: {counts[BETTER]} cell(s) better, {counts[WORSE]} worse, "
                f"{counts[TIE]} tied."
            )
    return lines


def _method_section(comparison: StudyComparison, before_name: str, after_name: str) -> list[str]:
    """How configs were matched and what counts as a regression, then the renamed and unmatched configs."""
    lines = [
        "",
        "## Method",
        "",
        f"Configs matched: {len(comparison.matches)} "
        f"({sum(m.by == 'name' for m in comparison.matches)} by name, "
        f"{sum(m.by != 'name' for m in comparison.matches)} by what they serve: {', '.join(LABEL_MATCH)}). "
        "A value is better or worse only when |a − b| > √(sa² + sb²) (the runs' standard deviations); "
        f"a regression is a worse value beyond {comparison.threshold:.0%}, or a cell measured in "
        f"{before_name} that failed or is missing in {after_name}. Ratios are {after_name} ÷ {before_name}.",
        "",
    ]
    renamed = [m for m in comparison.matches if m.by != "name"]
    if renamed:
        lines += ["| before | after |", "|---|---|"]
        lines += [f"| `{m.before}` | `{m.after}` |" for m in renamed]
        lines.append("")
    if comparison.only_before or comparison.only_after:
        lines.append(
            f"Only in {before_name}: {', '.join(f'`{c}`' for c in comparison.only_before) or 'none'}."
        )
        lines.append(f"Only in {after_name}: {', '.join(f'`{c}`' for c in comparison.only_after) or 'none'}.")
        lines.append("")
    return lines


def _by_size_of_change(changes: Iterable[CellChange]) -> list[CellChange]:
    return sorted(changes, key=lambda c: abs(math.log(c.ratio.mean)), reverse=True)


def _gap_line(gap: CellGap, before_name: str, after_name: str) -> str:
    return (
        f"- `{gap.config}` at depth {gap.depth}: {gap.before_status} in {before_name}, {gap.after_status} in "
        f"{after_name} ({gap.reason})"
    )


def _regressions_section(comparison: StudyComparison, before_name: str, after_name: str) -> list[str]:
    worst_first = _by_size_of_change(comparison.regressions)
    if not (worst_first or comparison.lost_cells):
        return []
    lines = ["## Regressions", ""]
    lines += [f"- {_change_line(c)}" for c in worst_first]
    lines += [_gap_line(g, before_name, after_name) for g in comparison.lost_cells]
    lines.append("")
    return lines


def _improvements_section(comparison: StudyComparison) -> list[str]:
    improvements = _by_size_of_change(c for c in comparison.changes if c.outcome == BETTER)
    if not improvements:
        return []
    return ["## Improvements", "", *(f"- {_change_line(c)}" for c in improvements), ""]


def _every_cell_section(comparison: StudyComparison, before_name: str, after_name: str) -> list[str]:
    """One table row per compared (config, depth): each metric before, after and their ratio."""
    if not comparison.changes:
        return []
    lines = ["## Every matched cell", ""]
    header = "| config | depth | " + " | ".join(
        f"{m.label} {before_name} | {m.label} {after_name} | {m.label} ratio" for m in comparison.metrics
    )
    lines += [header + " |", "|---|---|" + "---|---|---|" * len(comparison.metrics)]
    by_cell: dict[tuple[str, int], dict[str, CellChange]] = {}
    for change in comparison.changes:
        by_cell.setdefault((change.config, change.depth), {})[change.metric.label] = change
    for (config, depth), changes in by_cell.items():
        cells = []
        for metric in comparison.metrics:
            found = changes.get(metric.label)
            cells += (
                [_fmt(found.before), _fmt(found.after), f"{found.ratio.mean:.2f}× {found.outcome}"]
                if found
                else ["—", "—", "—"]
            )
        lines.append(f"| `{config}` | {depth} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def _not_compared_section(comparison: StudyComparison, before_name: str, after_name: str) -> list[str]:
    other_gaps = [g for g in comparison.gaps if not g.regresses]
    if not (other_gaps or comparison.unmeasured):
        return []
    lines = ["## Cells not compared", ""]
    lines += [_gap_line(g, before_name, after_name) for g in other_gaps]
    names = {"before": before_name, "after": after_name}
    lines += [
        f"- `{u.config}` at depth {u.depth}: {u.metric.label} has no usable value in "
        f"{' and '.join(names[side] for side in u.missing_in)} (the cell ran; llama-benchy gave none)"
        for u in comparison.unmeasured
    ]
    lines.append("")
    return lines


def ratio_series(comparison: StudyComparison, metric_label: str) -> dict[str, list[CellChange]]:
    """Per config, its changes of one metric in depth order (what the graph draws)."""
    series: dict[str, list[CellChange]] = {}
    for change in comparison.changes:
        if change.metric.label == metric_label:
            series.setdefault(change.config, []).append(change)
    return {config: sorted(changes, key=lambda c: c.depth) for config, changes in series.items()}


def write_ratio_graphs(
    comparison: StudyComparison, outdir: Path, before_name: str, after_name: str
) -> list[Path]:
    """One PNG per metric: each matched config's ratio against depth, its spread as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    for metric in comparison.metrics:
        series = ratio_series(comparison, metric.label)
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for config, changes in series.items():
            ax.errorbar(
                [c.depth for c in changes],
                [c.ratio.mean for c in changes],
                yerr=[c.ratio.std for c in changes],
                marker="o",
                capsize=3,
                label=config,
            )
        ax.axhline(1.0, color="grey", linewidth=1)
        better = "above" if metric.higher_is_better else "below"
        ax.set(
            xlabel="context depth (tokens)",
            ylabel=f"{metric.label} ratio ({after_name} ÷ {before_name})",
            title=f"{metric.label}: {after_name} against {before_name} ({better} 1 is better)",
        )
        ax.legend(fontsize="small")
        fig.tight_layout()
        path = outdir / f"compare_{metric.column}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
