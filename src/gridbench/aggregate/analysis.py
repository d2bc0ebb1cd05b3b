"""What the dataset says: differences with their spread, speedups over baselines, engines
on the same weights, the crossover depth, engine start-ups, the roofline and the capacity
under latency targets.

Pure functions over the dataset frames; the graphs and the report both use them.

The tie rule: two means a ± sa and b ± sb differ only when |a − b| > sqrt(sa² + sb²),
the combined spread of the runs; otherwise they tie. A missing std counts as 0.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from gridbench.aggregate.records import (
    ConfigIdentity,
    Row,
    Scalar,
    integer,
    missing,
    number,
    optional_float,
    optional_int,
    optional_str,
)
from gridbench.config.grid import StudyInfo

WIN, LOSS, TIE = "win", "loss", "tie"
SUMMARY_DECODE_DEPTHS = (0, 4096, 16384, 32768)
SUMMARY_TTFT_DEPTHS = (16384, 32768)
GROUPED_DEPTHS = (0, 8192, 16384, 32768)


@dataclass(frozen=True)
class Measure:
    """A mean and the standard deviation of the runs behind it."""

    mean: float
    std: float = 0.0

    @classmethod
    def of(cls, mean: Scalar, std: Scalar = None) -> Measure | None:
        if mean is None or missing(mean):
            return None
        return cls(float(mean), 0.0 if std is None or missing(std) else float(std))

    def spread_with(self, other: Measure) -> float:
        return math.hypot(self.std, other.std)

    def versus(self, other: Measure) -> str:
        """win / loss / tie of self against other under the tie rule."""
        diff = self.mean - other.mean
        if abs(diff) <= self.spread_with(other):
            return TIE
        return WIN if diff > 0 else LOSS

    def ratio(self, other: Measure) -> Measure:
        """self / other, its std propagated to first order from the relative stds."""
        value = self.mean / other.mean
        rel = math.hypot(self.std / self.mean if self.mean else 0.0, other.std / other.mean)
        return Measure(value, abs(value) * rel)


def measured(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"] == "ok"]


def with_cached(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows that have a prefix-cache cell (none in a dataset built before the pass existed)."""
    if "cached_status" not in frame.columns:
        return frame.iloc[0:0]
    return frame[frame["cached_status"].notna()]


def config_order(frame: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(frame["config"]))


def rows(frame: pd.DataFrame) -> list[Row]:
    """The frame's rows, each as column -> value."""
    records: list[Row] = frame.to_dict("records")
    return records


@dataclass(frozen=True)
class CellMeasures:
    """A depth dataset row as the analyses read it: which cell, how it ended, what it measured."""

    config: str
    depth: int
    status: str
    reason: str | None
    acceptance_rate: float | None
    # every column with a "<column>_std" beside it (decode_tps, ttft_ms, ...), read when asked
    # for: a report asks each cell for a few of its dozens
    row: Row = field(repr=False)

    @classmethod
    def of(cls, row: Row) -> CellMeasures:
        return cls(
            config=str(row["config"]),
            depth=integer(row["context_tokens"]),
            status=str(row["status"]),
            reason=optional_str(row.get("reason")),
            acceptance_rate=optional_float(row.get("acceptance_rate")),
            row=row,
        )

    def measure(self, column: str) -> Measure | None:
        """The cell's measure of ``column``; None when the cell failed, was skipped or has none."""
        if self.status != "ok" or f"{column}_std" not in self.row:
            return None
        return Measure.of(self.row[column], self.row[f"{column}_std"])


# (config, depth) -> its cell
CellIndex = Mapping[tuple[str, int], CellMeasures]


def cell_index(frame: pd.DataFrame) -> dict[tuple[str, int], CellMeasures]:
    """Cells by (config, depth), for lookups in loops (filtering a wide frame copies it)."""
    return {(cell.config, cell.depth): cell for cell in map(CellMeasures.of, rows(frame))}


def config_identities(frame: pd.DataFrame) -> list[ConfigIdentity]:
    """Each config of the frame once, in config order."""
    return [ConfigIdentity.from_row(row) for row in rows(frame.drop_duplicates("config"))]


def measure_at(cells: CellIndex, config: str, depth: int, column: str) -> Measure | None:
    """The measure of a measured cell (None when the cell is absent, failed or skipped)."""
    cell = cells.get((config, depth))
    return None if cell is None else cell.measure(column)


def short_depth(depth: int) -> str:
    """8192 -> 8k, for axis ticks and column headers."""
    return f"{depth // 1024}k" if depth >= 1024 and depth % 1024 == 0 else str(depth)


def pick_depths(available: Iterable[int], preferred: Sequence[int], count: int) -> list[int]:
    """The preferred depths that were measured; when fewer than two of them were, ``count``
    depths spread evenly over what was (a small grid still gets a useful table)."""
    available = sorted(set(available))
    chosen = [d for d in preferred if d in available]
    if len(chosen) >= min(2, len(preferred)) or not available:
        return chosen
    if len(available) <= count:
        return available
    step = (len(available) - 1) / (count - 1)
    return sorted({available[round(i * step)] for i in range(count)})


# --- baselines and speedups -------------------------------------------------------------


def baselines(frame: pd.DataFrame, study: StudyInfo) -> dict[str, str]:
    """config -> its baseline: the study's ``baseline`` mapping, else (for a speculative
    config) the non-speculative config on the same engine and checkpoint."""
    meta = frame.drop_duplicates("config").set_index("config")
    mapping = dict(study.baseline)
    result = {}
    for config in config_order(frame):
        if config in mapping:
            if mapping[config] in meta.index and mapping[config] != config:
                result[config] = mapping[config]
            continue
        if meta.at[config, "speculation_method"] == "none":
            continue
        candidates = meta[
            (meta["engine"] == meta.at[config, "engine"])
            & (meta["checkpoint"] == meta.at[config, "checkpoint"])
            & (meta["speculation_method"] == "none")
        ]
        if not candidates.empty:
            result[config] = candidates.index[0]
    return result


@dataclass(frozen=True)
class SpeedupPoint:
    depth: int
    config: Measure
    baseline: Measure
    speedup: Measure
    outcome: str


@dataclass(frozen=True)
class Speedup:
    """A config's decode over another's at every depth both measured: over its baseline, or
    (engine comparisons) over the same weights on another engine."""

    config: str
    baseline: str
    points: tuple[SpeedupPoint, ...]

    @property
    def crossover(self) -> tuple[int, int] | None:
        """(last depth of the leading run of wins, the next depth measured): where the
        config stops beating its baseline; None when it never starts or never stops."""
        for i, point in enumerate(self.points):
            if point.outcome != WIN:
                return (self.points[i - 1].depth, point.depth) if i > 0 else None
        return None

    @property
    def first_loss_after_crossover(self) -> int | None:
        crossover = self.crossover
        if crossover is None:
            return None
        return next((p.depth for p in self.points if p.depth >= crossover[1] and p.outcome == LOSS), None)

    @property
    def all_tie(self) -> bool:
        return all(p.outcome == TIE for p in self.points)

    def runs(self) -> list[tuple[str, int, int]]:
        """Outcomes compressed into runs: [(outcome, first depth, last depth), ...]."""
        runs: list[tuple[str, int, int]] = []
        for point in self.points:
            if runs and runs[-1][0] == point.outcome:
                runs[-1] = (point.outcome, runs[-1][1], point.depth)
            else:
                runs.append((point.outcome, point.depth, point.depth))
        return runs


def ratio_points(cells: CellIndex, config: str, other: str, column: str) -> tuple[SpeedupPoint, ...]:
    """``config`` over ``other`` at every depth both measured (``cells``: a ``cell_index``)."""
    points = []
    for depth in sorted(d for c, d in cells if c == config and (other, d) in cells):
        a = measure_at(cells, config, depth, column)
        b = measure_at(cells, other, depth, column)
        if a is None or b is None or b.mean <= 0:
            continue
        points.append(SpeedupPoint(depth, a, b, a.ratio(b), a.versus(b)))
    return tuple(points)


def speedups(frame: pd.DataFrame, study: StudyInfo, column: str = "decode_tps") -> list[Speedup]:
    """Each config with a baseline, over that baseline, at every depth both measured."""
    cells = cell_index(frame)
    return [
        Speedup(config, baseline, ratio_points(cells, config, baseline, column))
        for config, baseline in baselines(frame, study).items()
    ]


# --- engines on the same weights --------------------------------------------------------


def _engine_pairing(config: ConfigIdentity) -> tuple[str | None, str, int | None]:
    # what two configs on different engines share to be compared: speculation names differ
    # between engines, so the method and draft length stand for them
    return (config.weights, config.speculation_method, config.num_speculative_tokens)


def engine_comparisons(frame: pd.DataFrame, column: str = "decode_tps") -> list[Speedup]:
    """Every two configs on different engines with the same weights, speculation method and
    draft length, at every depth both measured (no points when none). The engine that comes
    first in the config order is over the other in every pair, so each pair of engines reads
    one way."""
    cells = cell_index(frame)
    configs = config_identities(frame)
    engine_rank = {engine: rank for rank, engine in enumerate(dict.fromkeys(c.engine for c in configs))}
    result = []
    for i, a in enumerate(configs):
        for b in configs[i + 1 :]:
            if a.engine == b.engine or _engine_pairing(a) != _engine_pairing(b):
                continue
            first, second = (a, b) if engine_rank[a.engine] < engine_rank[b.engine] else (b, a)
            result.append(
                Speedup(first.config, second.config, ratio_points(cells, first.config, second.config, column))
            )
    return result


@dataclass(frozen=True)
class EngineStart:
    """One cold start of an engine to healthy, and the measured cells that ran on it."""

    configs: tuple[str, ...]
    engine_label: str
    startup_s: float
    cells: int
    compile_cache: str | None = None  # "hit", "miss", or None: the kind keeps none, or an older record


def session_cells(sessions: pd.DataFrame) -> pd.DataFrame:
    """The sessions dataset holds a row per turn: a cell is its first turn's row."""
    return sessions.sort_values("turn", kind="stable").drop_duplicates(["config", "prompt_class", "sessions"])


def engine_starts(frames: Iterable[pd.DataFrame | None]) -> list[EngineStart]:
    """Every engine start behind the measured cells, in the frames' order. A cell records the
    start-up of the engine it ran on, a reused one's too, so one (fingerprint, start-up) is
    one start: also one whose first cell failed, and one that configs differing only in
    labels shared."""
    # (fingerprint, start-up) -> (engine label, its compile cache, the config of each cell on it)
    starts: dict[tuple[str, float], tuple[str, str | None, list[str]]] = {}
    for frame in frames:
        if frame is None:
            continue
        for row in rows(measured(frame)):
            startup_s = optional_float(row["engine_startup_s"])
            if startup_s is None:
                continue
            cache = row.get("engine_compile_cache")
            _, _, configs = starts.setdefault(
                (str(row["fingerprint"]), startup_s),
                (str(row["engine_label"]), str(cache) if isinstance(cache, str) else None, []),
            )
            configs.append(str(row["config"]))
    return [
        EngineStart(tuple(dict.fromkeys(configs)), engine_label, startup_s, len(configs), cache)
        for (_, startup_s), (engine_label, cache, configs) in starts.items()
    ]


# --- quantization: one model's weights in different precisions ---------------------------


def _shares_weights(a: ConfigIdentity, b: ConfigIdentity) -> bool:
    """Whether two checkpoints hold the same model: their declared ``weights`` match, or
    neither declares any (``weights`` then falls back to the checkpoint's own name), as in a
    grid that quantizes one model per engine."""
    declared = [c.model != c.checkpoint for c in (a, b)]
    return a.model == b.model if any(declared) else True


def precision_references(configs: Sequence[ConfigIdentity]) -> dict[str, str]:
    """Each non-speculative config's reference precision: the config on the same engine that
    serves the same model in the most bytes per token (a reference is its own). Speculation
    is left out: its acceptance, not the weights, would decide a speed ratio."""
    plain = [c for c in configs if c.speculation_method == "none"]
    references: dict[str, str] = {}
    for engine in dict.fromkeys(c.engine for c in plain):
        on_engine = [c for c in plain if c.engine == engine]
        for reference in sorted(on_engine, key=_bytes_per_token, reverse=True):
            if reference.config in references:
                continue
            group = [
                c
                for c in on_engine
                if c.config not in references
                and c.checkpoint != reference.checkpoint
                and _shares_weights(c, reference)
            ]
            references.update((c.config, reference.config) for c in [reference, *group])
    return references


def quantization_comparisons(frame: pd.DataFrame, column: str = "decode_tps") -> list[Speedup]:
    """Each non-speculative config over its reference precision (precision_references), at
    every depth both measured."""
    cells = cell_index(frame)
    return [
        Speedup(config, reference, ratio_points(cells, config, reference, column))
        for config, reference in precision_references(config_identities(frame)).items()
        if config != reference
    ]


def _bytes_per_token(config: ConfigIdentity) -> float:
    # unknown sizes sort last: such a config is compared to a known one, not used as reference
    return -math.inf if config.active_weight_gb is None else config.active_weight_gb


# --- how a ratio changes with depth ------------------------------------------------------

PAYS_EVERYWHERE = "pays at every depth"
LOSES_EVERYWHERE = "never faster"
TIES_EVERYWHERE = "tie at every depth"
PAYS_BELOW = "pays only below a depth"
PAYS_FROM = "pays only from a depth"
MIXED = "mixed"


@dataclass(frozen=True)
class Pattern:
    """What a ratio over depth comes to, in the terms a user acts on. ``boundary`` is the first
    depth it stops winning (PAYS_BELOW) or the first depth of its closing run of wins
    (PAYS_FROM); None for the other kinds."""

    kind: str
    boundary: int | None = None


def pattern(s: Speedup) -> Pattern:
    outcomes = [p.outcome for p in s.points]
    if all(o == WIN for o in outcomes):
        return Pattern(PAYS_EVERYWHERE)
    if all(o == TIE for o in outcomes):
        return Pattern(TIES_EVERYWHERE)
    if WIN not in outcomes:
        return Pattern(LOSES_EVERYWHERE)
    first_win = outcomes.index(WIN)
    if first_win == 0:
        stop = next(i for i, o in enumerate(outcomes) if o != WIN)
        if WIN not in outcomes[stop:]:
            return Pattern(PAYS_BELOW, s.points[stop].depth)
    elif all(o == WIN for o in outcomes[first_win:]):
        return Pattern(PAYS_FROM, s.points[first_win].depth)
    return Pattern(MIXED)


def fold(s: Speedup) -> float:
    """How much a comparison matters: its largest ratio or inverse ratio at any depth, outside
    the runs' spread (a tie counts as no difference)."""
    return max(
        (
            p.speedup.mean if p.speedup.mean >= 1 else 1 / p.speedup.mean
            for p in s.points
            if p.outcome != TIE and p.speedup.mean > 0
        ),
        default=1.0,
    )


# --- context depth -----------------------------------------------------------------------


@dataclass(frozen=True)
class DepthCost:
    """A config's decode and TTFT at its shallowest and deepest measured depth."""

    config: str
    first_depth: int
    last_depth: int
    first_decode: Measure
    last_decode: Measure
    last_ttft_ms: Measure | None

    @property
    def kept(self) -> float:
        """The share of its shallow decode rate a config keeps at its deepest depth."""
        return self.last_decode.mean / self.first_decode.mean


def depth_costs(frame: pd.DataFrame) -> list[DepthCost]:
    cells = cell_index(measured(frame))
    result = []
    for config in config_order(frame):
        decodes = {
            d: m
            for d in sorted(d for c, d in cells if c == config)
            if (m := measure_at(cells, config, d, "decode_tps")) is not None and m.mean > 0
        }
        depths = list(decodes)
        if len(depths) < 2:
            continue
        first, last = depths[0], depths[-1]
        ttft = measure_at(cells, config, last, "ttft_ms")
        result.append(DepthCost(config, first, last, decodes[first], decodes[last], ttft))
    return result


# --- roofline ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Roofline:
    config: str
    depth: int
    active_weight_gb: float
    ceiling_tok_s: float
    decode: Measure

    @property
    def realised(self) -> float:
        return self.decode.mean / self.ceiling_tok_s


def rooflines(frame: pd.DataFrame, memory_bandwidth_gb_s: float | None) -> list[Roofline]:
    """Decode at the smallest measured depth over bandwidth ÷ active weight bytes per token."""
    if not memory_bandwidth_gb_s:
        return []
    ok = measured(frame)
    result = []
    for config in config_order(frame):
        by_depth = ok[ok["config"] == config].sort_values("context_tokens")
        if by_depth.empty or missing(by_depth.iloc[0]["active_weight_gb"]):
            continue
        row = by_depth.iloc[0]
        decode = Measure.of(row["decode_tps"], row["decode_tps_std"])
        if decode is None:
            continue
        ceiling = memory_bandwidth_gb_s / float(row["active_weight_gb"])
        result.append(
            Roofline(config, int(row["context_tokens"]), float(row["active_weight_gb"]), ceiling, decode)
        )
    return result


# --- acceptance -------------------------------------------------------------------------


def acceptance_by_position(frame: pd.DataFrame) -> dict[str, list[float] | None]:
    """Per speculative config: per-position acceptance over all its measured cells, each
    cell weighted by its drafts (Σ accepted at i / Σ drafts); None without per-position data."""
    ok = measured(frame)
    result: dict[str, list[float] | None] = {}
    for config in config_order(frame[frame["speculation_method"] != "none"]):
        totals: list[float] = []
        drafts = 0.0
        for _, row in ok[ok["config"] == config].iterrows():
            if missing(row["acceptance_per_position"]) or missing(row["spec_drafts"]):
                continue
            rates = json.loads(row["acceptance_per_position"])
            totals += [0.0] * (len(rates) - len(totals))
            for i, rate in enumerate(rates):
                totals[i] += rate * float(row["spec_drafts"])
            drafts += float(row["spec_drafts"])
        result[config] = [t / drafts for t in totals] if drafts > 0 else None
    return result


# --- natural matrix ---------------------------------------------------------------------


@dataclass(frozen=True)
class NaturalLevel:
    """A measured concurrency level of a (config, prompt class), as the capacity quotes it."""

    concurrency: int
    output_tok_s: float | None
    ttft_ms_p50: float | None
    tpot_ms_p50: float | None

    @classmethod
    def of(cls, row: Row) -> NaturalLevel:
        return cls(
            concurrency=integer(row["concurrency"]),
            output_tok_s=optional_float(row.get("output_tok_s")),
            ttft_ms_p50=optional_float(row.get("ttft_ms_p50")),
            tpot_ms_p50=optional_float(row.get("tpot_ms_p50")),
        )


@dataclass(frozen=True)
class Capacity:
    config: str
    prompt_class: str
    concurrency: int | None  # the highest level meeting both targets; None when none does
    best: NaturalLevel | None  # that level
    first_miss: NaturalLevel | None  # the lowest measured level that misses


def meets(row: Row, targets: Mapping[str, float]) -> bool:
    """Whether a natural row's values of the targets' columns are all there and within them."""
    return all(
        (value := optional_float(row[metric])) is not None and value <= target
        for metric, target in targets.items()
    )


def capacities(natural: pd.DataFrame, targets: Mapping[str, float]) -> list[Capacity]:
    """Per (config, prompt class): the highest concurrency whose medians meet every target."""
    ok = natural[natural["status"] == "ok"]
    result = []
    for (config, prompt_class), group in natural.groupby(["config", "prompt_class"], sort=False):
        levels = ok[(ok["config"] == config) & (ok["prompt_class"] == prompt_class)].sort_values(
            "concurrency"
        )
        if levels.empty and group.empty:
            continue
        measured_levels = rows(levels)
        passing = [NaturalLevel.of(r) for r in measured_levels if meets(r, targets)]
        missing = [NaturalLevel.of(r) for r in measured_levels if not meets(r, targets)]
        best = passing[-1] if passing else None
        result.append(
            Capacity(
                config,
                prompt_class,
                best.concurrency if best else None,
                best,
                missing[0] if missing else None,
            )
        )
    return result


# --- Pareto frontier: throughput per GPU against per-user speed --------------------------


@dataclass(frozen=True)
class ParetoPoint:
    """One measured (config, prompt class, concurrency) level, as operators chart it."""

    config: str
    prompt_class: str
    concurrency: int
    per_user_tok_s: float  # each request's output tok/s, p50
    tok_s_per_gpu: float  # aggregate output tok/s ÷ the config's GPUs (1 on a CPU)
    gpus: int
    ttft_ms_p50: float | None
    tpot_ms_p50: float | None
    on_frontier: bool
    meets_targets: bool | None  # None: the study sets no latency targets


def pareto_points(natural: pd.DataFrame, targets: Mapping[str, float]) -> list[ParetoPoint]:
    """Every measured level, flagged when no other level of its prompt class is at least as
    fast per user and per GPU and faster in one of the two."""
    ok = natural[natural["status"] == "ok"].dropna(subset=["req_tok_s_p50", "output_tok_s"])
    points = []
    for row in rows(ok):
        gpus = optional_int(row.get("gpu_count")) or 1
        points.append(
            ParetoPoint(
                config=str(row["config"]),
                prompt_class=str(row["prompt_class"]),
                concurrency=integer(row["concurrency"]),
                per_user_tok_s=number(row["req_tok_s_p50"]),
                tok_s_per_gpu=number(row["output_tok_s"]) / gpus,
                gpus=gpus,
                ttft_ms_p50=optional_float(row.get("ttft_ms_p50")),
                tpot_ms_p50=optional_float(row.get("tpot_ms_p50")),
                on_frontier=False,
                meets_targets=meets(row, targets) if targets else None,
            )
        )

    def dominated(p: ParetoPoint) -> bool:
        return any(
            q.prompt_class == p.prompt_class
            and q.per_user_tok_s >= p.per_user_tok_s
            and q.tok_s_per_gpu >= p.tok_s_per_gpu
            and (q.per_user_tok_s > p.per_user_tok_s or q.tok_s_per_gpu > p.tok_s_per_gpu)
            for q in points
        )

    return [dataclasses.replace(p, on_frontier=not dominated(p)) for p in points]


def best_under_targets(points: Sequence[ParetoPoint]) -> dict[str, ParetoPoint]:
    """Per prompt class, the level with the most throughput per GPU that meets the targets."""
    best: dict[str, ParetoPoint] = {}
    for p in points:
        if p.meets_targets and (
            p.prompt_class not in best or p.tok_s_per_gpu > best[p.prompt_class].tok_s_per_gpu
        ):
            best[p.prompt_class] = p
    return best


@dataclass(frozen=True)
class ClassAcceptance:
    """A speculative config on one prompt class at one level: what its drafts achieved, and
    the decode rate against the same weights and engine without speculation."""

    config: str
    prompt_class: str
    concurrency: int
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    per_position: tuple[float, ...]
    output_tok_s: float | None
    baseline: str | None  # the config without speculation it is compared with
    baseline_tok_s: float | None
    output_tokens_p50: float | None
    max_tokens: int | None
    ended_on_eos: int | None
    ok: int

    @property
    def speedup(self) -> float | None:
        if self.output_tok_s is None or not self.baseline_tok_s:
            return None
        return self.output_tok_s / self.baseline_tok_s


def plain_twin(config: ConfigIdentity, identities: Sequence[ConfigIdentity]) -> str | None:
    """The config serving the same checkpoint on the same engine without speculation."""
    for other in identities:
        if (
            other.speculation_method == "none"
            and other.engine == config.engine
            and other.checkpoint == config.checkpoint
        ):
            return other.config
    return None


def class_acceptance(natural: pd.DataFrame) -> list[ClassAcceptance]:
    """Every measured level of every speculative config, by prompt class (seed 000's
    workload-class reality check): acceptance differs by what is asked."""
    ok = measured(natural)
    identities = config_identities(natural)
    by_cell = {(str(r["config"]), str(r["prompt_class"]), integer(r["concurrency"])): r for r in rows(ok)}
    result = []
    for config in identities:
        if config.speculation_method == "none":
            continue
        twin = plain_twin(config, identities)
        for (name, prompt_class, concurrency), row in by_cell.items():
            if name != config.config:
                continue
            plain = by_cell.get((twin, prompt_class, concurrency)) if twin else None
            per_position = optional_str(row.get("acceptance_per_position"))
            result.append(
                ClassAcceptance(
                    config=name,
                    prompt_class=prompt_class,
                    concurrency=concurrency,
                    acceptance_rate=optional_float(row.get("acceptance_rate")),
                    mean_acceptance_length=optional_float(row.get("mean_acceptance_length")),
                    per_position=tuple(json.loads(per_position)) if per_position else (),
                    output_tok_s=optional_float(row.get("output_tok_s")),
                    baseline=twin,
                    baseline_tok_s=optional_float(plain.get("output_tok_s")) if plain else None,
                    output_tokens_p50=optional_float(row.get("output_tokens_p50")),
                    max_tokens=optional_int(row.get("max_tokens")),
                    ended_on_eos=optional_int(row.get("ended_on_eos")),
                    ok=optional_int(row.get("ok")) or 0,
                )
            )
    return result


def acceptance_spread(
    levels: Sequence[ClassAcceptance],
) -> dict[tuple[str, int], tuple[ClassAcceptance, ...]]:
    """Per (speculative config, concurrency) with acceptance on two classes or more: its
    levels, the highest acceptance first."""
    grouped: dict[tuple[str, int], list[ClassAcceptance]] = {}
    for level in levels:
        if level.acceptance_rate is not None:
            grouped.setdefault((level.config, level.concurrency), []).append(level)
    return {
        key: tuple(sorted(group, key=lambda lv: -(lv.acceptance_rate or 0.0)))
        for key, group in grouped.items()
        if len(group) > 1
    }
