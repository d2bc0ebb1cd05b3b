"""Draft length: which number of drafted tokens k serves fastest, where a study serves one
draft at several.

A k-sweep family is the speculative configs that differ in nothing but
``speculation.num_speculative_tokens``. Each point of its sweep (a prompt class at a
concurrency, or a context depth) gets the k with the highest throughput, against the
family's largest k, "the default k" (seed 000: DFlash at k = 5 beat the default k = 15 by
23 % at concurrency 10), and against the config without speculation (analysis.baselines).
Pure functions over the grid and the dataset frames.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import pandas as pd

from gridbench.aggregate import analysis
from gridbench.aggregate.analysis import Measure
from gridbench.aggregate.records import integer, optional_float
from gridbench.config.grid import Grid, ServingConfig
from gridbench.util import codec


@dataclass(frozen=True)
class KFamily:
    """Configs serving one draft the same way at two draft lengths k or more: one config per
    k, by k."""

    configs: tuple[str, ...]
    ks: tuple[int, ...]

    @property
    def default_k(self) -> int:
        return self.ks[-1]

    def config_of(self, k: int) -> str:
        return self.configs[self.ks.index(k)]


def _served_the_same(config: ServingConfig) -> str:
    """Everything that decides how a config is served and measured, but its names and k."""
    speculation = replace(config.speculation, name="", label="", num_speculative_tokens=None)
    rest = replace(config, name="", label="", speculation=speculation)
    return json.dumps(codec.to_json(rest), sort_keys=True, default=str)


def families(configs: Mapping[str, ServingConfig]) -> list[KFamily]:
    """The k-sweep families among ``configs``, in the order of their first config. A config
    whose k an earlier one of its family has is left out: one config answers for each k."""
    groups: dict[str, dict[int, str]] = {}
    for name, config in configs.items():
        k = config.speculation.num_speculative_tokens
        if config.speculation.enabled and k is not None:
            groups.setdefault(_served_the_same(config), {}).setdefault(k, name)
    return [
        KFamily(tuple(by_k[k] for k in sorted(by_k)), tuple(sorted(by_k)))
        for by_k in groups.values()
        if len(by_k) >= 2
    ]


@dataclass(frozen=True)
class KChoice:
    """One point of a family's sweep: each measured k's throughput there, the default k's
    and the baseline's."""

    tok_s: Mapping[int, Measure]  # measured k -> its throughput, by k
    default_k: int
    baseline: Measure | None

    @property
    def best_k(self) -> int:
        # the smaller k on a tie: fewer drafted tokens for the same speed
        return max(self.tok_s, key=lambda k: self.tok_s[k].mean)

    @property
    def best(self) -> Measure:
        return self.tok_s[self.best_k]

    @property
    def over_default(self) -> Measure | None:
        default = self.tok_s.get(self.default_k)
        return self.best.ratio(default) if default is not None else None

    @property
    def over_baseline(self) -> Measure | None:
        return self.best.ratio(self.baseline) if self.baseline is not None else None


def choice(tok_s: Mapping[int, Measure | None], default_k: int, baseline: Measure | None) -> KChoice | None:
    """The point's choice among the ks measured there with a throughput; None with fewer than
    two: one k alone is no choice."""
    measured = {k: m for k, m in sorted(tok_s.items()) if m is not None and m.mean > 0}
    if len(measured) < 2:
        return None
    return KChoice(measured, default_k, baseline if baseline is not None and baseline.mean > 0 else None)


@dataclass(frozen=True)
class ClassChoice:
    """A family's choice on one prompt class at one concurrency (aggregate output tok/s)."""

    prompt_class: str
    concurrency: int
    choice: KChoice


@dataclass(frozen=True)
class DepthChoice:
    """A family's choice at one context depth (llama-benchy decode tok/s, mean ± std)."""

    depth: int
    choice: KChoice


@dataclass(frozen=True)
class KSweep:
    """A family and what its sweep found: by prompt class and concurrency, and by depth."""

    family: KFamily
    baseline: str | None  # the default k's config's (analysis.baselines)
    by_class: tuple[ClassChoice, ...]
    by_depth: tuple[DepthChoice, ...]


@dataclass(frozen=True)
class KSummary:
    """The k best at the most points of a sweep, and how it compares with the default k
    along the sweep's axis (concurrency or depth)."""

    k: int
    wins: int
    points: int
    others: Mapping[int, int]  # every other best k -> at how many points, by k
    # (axis value, lowest, highest) of k's throughput over the default k's, where both were
    # measured; empty when k is the default
    against_default: tuple[tuple[int, float, float], ...]


def summarize(points: Sequence[tuple[int, KChoice]]) -> KSummary | None:
    """``points``: (axis value, choice) pairs, a concurrency's or a depth's."""
    if not points:
        return None
    counts = Counter(c.best_k for _, c in points)
    k = max(sorted(counts), key=lambda best: counts[best])
    ratios: dict[int, list[float]] = {}
    for axis, c in points:
        default = c.tok_s.get(c.default_k)
        if k != c.default_k and k in c.tok_s and default is not None:
            ratios.setdefault(axis, []).append(c.tok_s[k].mean / default.mean)
    return KSummary(
        k=k,
        wins=counts[k],
        points=len(points),
        others={other: counts[other] for other in sorted(counts) if other != k},
        against_default=tuple((axis, min(r), max(r)) for axis, r in sorted(ratios.items())),
    )


def class_points(sweep: KSweep) -> list[tuple[int, KChoice]]:
    return [(c.concurrency, c.choice) for c in sweep.by_class]


def depth_points(sweep: KSweep) -> list[tuple[int, KChoice]]:
    return [(d.depth, d.choice) for d in sweep.by_depth]


# --- from the dataset frames ---------------------------------------------------------------


def _by_class(family: KFamily, natural: pd.DataFrame, baseline: str | None) -> tuple[ClassChoice, ...]:
    members = set(family.configs) | ({baseline} if baseline else set())
    tok_s: dict[tuple[str, str, int], Measure] = {}
    points: dict[tuple[str, int], None] = {}  # in the dataset's order
    for row in analysis.rows(natural[natural["config"].isin(members)]):
        key = (str(row["prompt_class"]), integer(row["concurrency"]))
        rate = optional_float(row.get("output_tok_s")) if row["status"] == "ok" else None
        if rate is not None:
            tok_s[(str(row["config"]), *key)] = Measure(rate)
        if row["config"] in family.configs:
            points[key] = None
    result = []
    for prompt_class, concurrency in points:
        found = choice(
            {k: tok_s.get((family.config_of(k), prompt_class, concurrency)) for k in family.ks},
            family.default_k,
            tok_s.get((baseline, prompt_class, concurrency)) if baseline else None,
        )
        if found is not None:
            result.append(ClassChoice(prompt_class, concurrency, found))
    return tuple(result)


def _by_depth(family: KFamily, dataset: pd.DataFrame, baseline: str | None) -> tuple[DepthChoice, ...]:
    cells = analysis.cell_index(dataset)
    depths = sorted({d for c, d in cells if c in family.configs})
    result = []
    for depth in depths:
        found = choice(
            {k: analysis.measure_at(cells, family.config_of(k), depth, "decode_tps") for k in family.ks},
            family.default_k,
            analysis.measure_at(cells, baseline, depth, "decode_tps") if baseline else None,
        )
        if found is not None:
            result.append(DepthChoice(depth, found))
    return tuple(result)


def sweeps(grid: Grid, dataset: pd.DataFrame, natural: pd.DataFrame | None) -> list[KSweep]:
    """Every k-sweep family among the configs with a row, and what its sweep found."""
    frames = [f for f in (dataset, natural) if f is not None and not f.empty]
    present = {str(c) for f in frames for c in f["config"]}
    baselines = {k: v for f in frames for k, v in analysis.baselines(f, grid.study).items()}
    result = []
    for family in families({n: c for n, c in grid.configs.items() if n in present}):
        baseline = baselines.get(family.configs[-1])
        result.append(
            KSweep(
                family,
                baseline,
                _by_class(family, natural, baseline) if natural is not None and not natural.empty else (),
                _by_depth(family, dataset, baseline) if not dataset.empty else (),
            )
        )
    return result
