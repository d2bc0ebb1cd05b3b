"""Whether the seeds' speculation findings show on the weights measured here: acceptance that
differs by prompt class (seed 000's workload-class reality check), acceptance that decays by
draft position (seed 000: DFlash 52 % at position 1 down to 2 % at position 8) and a
speed-up that changes with context depth (seed 002's cliff past ~8k).

Each is judged per speculative config from the same measures the report's tables show, with
a stated threshold, and says "not shown" with its numbers as plainly as "shown". Pure
functions over the dataset frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from gridbench.aggregate import analysis
from gridbench.aggregate.text import pct, ratio_text
from gridbench.config.grid import StudyInfo

# differences smaller than these are not called a dependence
CLASS_SPREAD = 0.10  # acceptance, highest class minus lowest, at one level
POSITION_DECAY = 0.10  # acceptance, first draft position minus last
DEPTH_CHANGE = 1.10  # speed-up, largest over smallest across depths

BY_CLASS = "acceptance differs by prompt class"
BY_POSITION = "acceptance decays by draft position"
BY_DEPTH = "speed-up changes with context depth"
PHENOMENA = (BY_CLASS, BY_POSITION, BY_DEPTH)


@dataclass(frozen=True)
class Judgement:
    """One phenomenon for one config: shown or not (None: not measured here), and the numbers."""

    phenomenon: str
    config: str
    shown: bool | None
    evidence: str


def judge(
    configs: Sequence[str], dataset: pd.DataFrame, natural: pd.DataFrame | None, study: StudyInfo
) -> list[Judgement]:
    """The three phenomena for each of ``configs`` (speculative configs), in that order."""
    spreads = analysis.acceptance_spread(analysis.class_acceptance(natural)) if natural is not None else {}
    positions = analysis.acceptance_by_position(dataset) if not dataset.empty else {}
    speedups = {s.config: s for s in analysis.speedups(dataset, study)} if not dataset.empty else {}
    result = []
    for config in configs:
        result += [
            _by_class(config, spreads),
            _by_position(config, positions.get(config)),
            _by_depth(config, speedups.get(config)),
        ]
    return result


def _by_class(config: str, spreads: dict[tuple[str, int], tuple[analysis.ClassAcceptance, ...]]) -> Judgement:
    levels = [c for name, c in spreads if name == config]
    if not levels:
        return Judgement(BY_CLASS, config, None, "not measured on two prompt classes")
    concurrency = min(levels)
    ranked = spreads[(config, concurrency)]
    high, low = ranked[0].acceptance_rate or 0.0, ranked[-1].acceptance_rate or 0.0
    classes = " · ".join(f"{lv.prompt_class} {pct(lv.acceptance_rate or 0.0)}" for lv in ranked)
    return Judgement(
        BY_CLASS,
        config,
        high - low >= CLASS_SPREAD,
        f"{classes} at c={concurrency} ({(high - low) * 100:.0f} pp)",
    )


def _by_position(config: str, rates: Sequence[float] | None) -> Judgement:
    if not rates:
        return Judgement(BY_POSITION, config, None, "no per-position counters")
    if len(rates) < 2:
        return Judgement(BY_POSITION, config, None, "one position drafted")
    drop = rates[0] - rates[-1]
    evidence = f"{pct(rates[0])} at position 1, {pct(rates[-1])} at {len(rates)}"
    return Judgement(BY_POSITION, config, drop >= POSITION_DECAY, evidence)


def _by_depth(config: str, speedup: analysis.Speedup | None) -> Judgement:
    points = speedup.points if speedup is not None else ()
    if len(points) < 2:
        return Judgement(BY_DEPTH, config, None, "fewer than two depths against its baseline")
    low = min(points, key=lambda p: p.speedup.mean)
    high = max(points, key=lambda p: p.speedup.mean)
    first, last = points[0], points[-1]
    evidence = (
        f"{ratio_text(first.speedup)} at {analysis.short_depth(first.depth)} → "
        f"{ratio_text(last.speedup)} at {analysis.short_depth(last.depth)} "
        f"(lowest {ratio_text(low.speedup)} at {analysis.short_depth(low.depth)}, "
        f"highest {ratio_text(high.speedup)} at {analysis.short_depth(high.depth)})"
    )
    # beyond the runs' spread as well as by DEPTH_CHANGE: noise is no change
    changes = high.speedup.versus(low.speedup) == analysis.WIN and (
        high.speedup.mean >= DEPTH_CHANGE * low.speedup.mean
    )
    return Judgement(BY_DEPTH, config, changes, evidence)
