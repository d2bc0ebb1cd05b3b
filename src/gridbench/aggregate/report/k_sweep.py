"""The draft length section: for each draft served at several k, the fastest k by prompt
class and concurrency, and by context depth, against the largest k and the baseline."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from gridbench.aggregate import k_sweep
from gridbench.aggregate.analysis import Measure
from gridbench.aggregate.k_sweep import KChoice, KFamily, KSummary, KSweep
from gridbench.aggregate.records import ConfigIdentity
from gridbench.aggregate.report.markdown import code, table
from gridbench.aggregate.text import DASH, and_list, num, pm, ratio_text
from gridbench.aggregate.verdict import speculation_family
from gridbench.aggregate.weights_origin import MECHANISM_CHECK, RANDOM_WEIGHTS_SHOW, is_random
from gridbench.config.grid import Grid

SECTION = "Draft length k"
LINK = f"[{SECTION}](#draft-length-k)"


def family_label(grid: Grid, family: KFamily) -> str:
    """The draft's method and what it serves on: "DFlash on nvfp4 (aeon 0.23)"."""
    config = grid.configs[family.configs[0]]
    method = speculation_family(ConfigIdentity.from_config(config))
    return f"{method} on {config.checkpoint.name} ({config.engine.label})"


def _on_random_weights(grid: Grid, family: KFamily) -> bool:
    return is_random(grid.configs[family.configs[0]].checkpoint.origin)


def _times(ratio: Measure | None, spread: bool) -> str:
    if ratio is None:
        return DASH
    return ratio_text(ratio) if spread else f"{num(ratio.mean, 2)}×"


def _every_k(choice: KChoice, ks: Sequence[int]) -> str:
    return " / ".join(num(choice.tok_s[k].mean) if k in choice.tok_s else DASH for k in ks)


def _range(low: float, high: float) -> str:
    return f"{low:.2f}×" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}–{high:.2f}×"


def summary_sentence(summary: KSummary, default_k: int, noun: str, axis: str) -> str:
    """In words: "k = 4 is best in 9 of 12 class/concurrency cells (elsewhere k = 1 in 3);
    against the default k = 15 it gives 1.25–1.31× at c = 1 and 1.08–1.12× at c = 16."."""
    nouns = noun if summary.points > 1 else noun.removesuffix("s")
    text = f"k = {summary.k} is best in {summary.wins} of {summary.points} {nouns}"
    if summary.others:
        text += f" (elsewhere {and_list([f'k = {k} in {n}' for k, n in summary.others.items()])})"
    ends = summary.against_default
    if ends:
        shown = [ends[0], ends[-1]] if len(ends) > 1 else [ends[0]]
        where = " and ".join(f"{_range(low, high)} at {axis}{value}" for value, low, high in shown)
        text += f"; against the default k = {default_k} it gives {where}"
    return text + "."


def _class_block(sweep: KSweep) -> str:
    ks, default_k = sweep.family.ks, sweep.family.default_k
    rows = [
        (
            c.prompt_class,
            c.concurrency,
            c.choice.best_k,
            num(c.choice.best.mean),
            _times(c.choice.over_default, spread=False),
            _times(c.choice.over_baseline, spread=False),
            _every_k(c.choice, ks),
        )
        for c in sweep.by_class
    ]
    header = (
        "class",
        "c",
        "best k",
        "its agg tok/s",
        f"× over k = {default_k}",
        f"× over {code(sweep.baseline)}" if sweep.baseline else "× over baseline",
        f"agg tok/s at k = {' / '.join(map(str, ks))}",
    )
    text = "Natural prompts, aggregate output tok/s:\n\n" + table(header, rows)
    summary = k_sweep.summarize(k_sweep.class_points(sweep))
    if summary is not None:
        text += "\n\n" + summary_sentence(summary, default_k, "class/concurrency cells", "c = ")
    return text


def _depth_block(sweep: KSweep) -> str:
    ks, default_k = sweep.family.ks, sweep.family.default_k
    rows = [
        (
            d.depth,
            d.choice.best_k,
            pm(d.choice.best),
            _times(d.choice.over_default, spread=True),
            _times(d.choice.over_baseline, spread=True),
            _every_k(d.choice, ks),
        )
        for d in sweep.by_depth
    ]
    header = (
        "depth",
        "best k",
        "its decode tok/s",
        f"× over k = {default_k}",
        f"× over {code(sweep.baseline)}" if sweep.baseline else "× over baseline",
        f"decode tok/s at k = {' / '.join(map(str, ks))}",
    )
    text = "Depth sweep, llama-benchy decode tok/s (mean ± std of the runs):\n\n" + table(header, rows)
    summary = k_sweep.summarize(k_sweep.depth_points(sweep))
    if summary is not None:
        text += "\n\nOn the depth sweep, " + summary_sentence(summary, default_k, "depths", "depth ")
    return text


def _family_block(grid: Grid, sweep: KSweep) -> str:
    family = sweep.family
    members = and_list([f"{code(c)} (k = {k})" for c, k in zip(family.configs, family.ks, strict=True)])
    baseline = f", the baseline {code(sweep.baseline)}" if sweep.baseline else ", no baseline measured"
    parts = [
        f"### {family_label(grid, family)}: k = {and_list([str(k) for k in family.ks])}",
        f"{members}; the default k is {family.default_k}{baseline}.",
    ]
    if sweep.by_class:
        parts.append(_class_block(sweep))
    if sweep.by_depth:
        parts.append(_depth_block(sweep))
    if not sweep.by_class and not sweep.by_depth:
        parts.append("No point of the sweep has two ks measured.")
    if _on_random_weights(grid, family):
        parts.append(f"These configs serve random weights: their best k shows that {RANDOM_WEIGHTS_SHOW}.")
    return "\n\n".join(parts)


def k_sweep_section(grid: Grid, dataset: pd.DataFrame, natural: pd.DataFrame | None) -> str:
    """The section, or nothing when no draft is served at two ks or more."""
    sweeps = k_sweep.sweeps(grid, dataset, natural)
    if not sweeps:
        return ""
    intro = (
        "Configs that serve one draft the same way but for its number of drafted tokens k "
        "(`num_speculative_tokens`) form a family. At each point of its sweep, the best k is the "
        "one with the highest throughput, set against the family's largest k (the default k) and "
        "against its baseline (`study.baseline`, else the same engine and checkpoint without "
        "speculation); a point where fewer than two ks were measured is left out."
    )
    return "\n\n".join([f"## {SECTION}", intro, *(_family_block(grid, s) for s in sweeps)])


def k_sweep_verdict_lines(grid: Grid, dataset: pd.DataFrame, natural: pd.DataFrame | None) -> list[str]:
    """One line per family: its best k where it is best most often, on the natural prompts
    where measured, else on the depth sweep."""
    lines = []
    for sweep in k_sweep.sweeps(grid, dataset, natural):
        summary, noun = k_sweep.summarize(k_sweep.class_points(sweep)), "class/concurrency cells"
        if summary is None:
            summary, noun = k_sweep.summarize(k_sweep.depth_points(sweep)), "depths"
        if summary is None:
            continue
        ks = and_list([str(k) for k in sweep.family.ks])
        line = (
            f"Draft length: {family_label(grid, sweep.family)} is fastest at k = {summary.k} in "
            f"{summary.wins} of {summary.points} {noun} (k = {ks} measured; see {LINK})."
        )
        lines.append(f"{MECHANISM_CHECK}: {line}" if _on_random_weights(grid, sweep.family) else line)
    return lines
