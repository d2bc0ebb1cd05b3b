"""Anomaly checks: what in a study's data an expert would question before trusting it.

Each check is a pure function of the dataset frames that returns a ``Check``: what it looked
for, the offending cells (none when it passes) and, where the repository documents one, what
typically causes it. The report lists every check; the CLI logs each one that triggers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from gridbench.aggregate import analysis
from gridbench.aggregate.quality import NEAR_TIE_NATS
from gridbench.aggregate.text import and_list, num, pct, ratio_text
from gridbench.config.grid import StudyInfo
from gridbench.engines.kinds import KINDS

# TTFT p50 comes from a few requests per level: a drop under a quarter is queueing noise,
# not a server that got faster under load
LOAD_TOLERANCE = 0.25
# below 1 % accepted, a drafter contributes nothing: a broken or mismatched draft
ACCEPTANCE_FLOOR = 0.01
# how many offending cells a check line names before it counts the rest
NAMED = 4
# enough of a GPU's UUID ("GPU-" and 8 hex digits) to tell a study's machines apart
GPU_ID_CHARS = 12


@dataclass(frozen=True)
class Check:
    title: str
    findings: tuple[str, ...]  # one per offending config or cell; empty when the check passes
    passed: str  # what the line says when nothing triggers (or why the check could not run)
    cause: str = ""

    @property
    def triggered(self) -> bool:
        return bool(self.findings)

    @property
    def summary(self) -> str:
        """The check in plain words, as the log prints it."""
        if not self.triggered:
            return f"{self.title}: {self.passed}."
        named = list(self.findings[:NAMED])
        if len(self.findings) > NAMED:
            named.append(f"{len(self.findings) - NAMED} more")
        text = f"{self.title}: " + "; ".join(named) + "."
        return f"{text} {self.cause}" if self.cause else text

    @property
    def line(self) -> str:
        """The check as the report lists it: a warning stands out, a pass says what held."""
        return f"**warning** — {self.summary}" if self.triggered else f"ok — {self.summary}"


def run_checks(
    dataset: pd.DataFrame,
    natural: pd.DataFrame | None,
    study: StudyInfo,
    quality: pd.DataFrame | None = None,
) -> list[Check]:
    """Every check; the losslessness check only for a study with a quality dataset."""
    bandwidth = study.hardware.memory_bandwidth_gb_s
    return [
        latency_falls_with_load(natural),
        acceptance_near_zero(dataset, natural),
        decode_above_roofline(dataset, bandwidth),
        errors_and_incomplete(dataset, natural),
        spread_exceeds_effect(dataset, study),
        engine_restarts(dataset, natural),
        machines_differ(dataset, natural),
        cached_context_not_faster(dataset),
        *([speculation_not_lossless(quality)] if quality is not None else []),
    ]


# --- (a) latency that falls as load rises -----------------------------------------------


@dataclass(frozen=True)
class LoadInversion:
    config: str
    engine_kind: str
    prompt_class: str
    low_concurrency: int
    low_ttft_ms: float
    high_concurrency: int
    high_ttft_ms: float
    serve_command: str


def load_inversions(natural: pd.DataFrame | None) -> list[LoadInversion]:
    """Per (config, prompt class): the largest drop of TTFT p50 from a lower concurrency to a
    higher one, when it exceeds ``LOAD_TOLERANCE``."""
    if natural is None:
        return []
    ok = analysis.measured(natural).dropna(subset=["ttft_ms_p50"])
    result = []
    for (config, prompt_class), group in ok.groupby(["config", "prompt_class"], sort=False):
        levels = group.sort_values("concurrency")
        rows = list(zip(levels["concurrency"].astype(int), levels["ttft_ms_p50"].astype(float), strict=True))
        drops = [
            (low, high)
            for i, low in enumerate(rows)
            for high in rows[i + 1 :]
            if low[1] > high[1] * (1 + LOAD_TOLERANCE)
        ]
        if not drops:
            continue
        low, high = max(drops, key=lambda pair: pair[0][1] / pair[1][1])
        first = levels.iloc[0]
        result.append(
            LoadInversion(
                str(config),
                str(first["engine_kind"]),
                str(prompt_class),
                low[0],
                low[1],
                high[0],
                high[1],
                str(first["serve_command"] or ""),
            )
        )
    return result


def latency_falls_with_load(natural: pd.DataFrame | None) -> Check:
    title = "latency falls as load rises"
    if natural is None:
        return Check(title, (), "no natural-prompt cell was measured")
    inversions = load_inversions(natural)
    findings = tuple(
        f"{i.config} on {i.prompt_class}: TTFT p50 {num(i.low_ttft_ms, 0)} ms at c={i.low_concurrency}, "
        f"{num(i.high_ttft_ms, 0)} ms at c={i.high_concurrency}"
        for i in inversions
    )
    cause = " ".join(
        _inversion_cause(kind, [i for i in inversions if i.engine_kind == kind])
        for kind in dict.fromkeys(i.engine_kind for i in inversions)
    ).strip()
    return Check(
        title,
        findings,
        f"TTFT p50 never drops by more than {pct(LOAD_TOLERANCE)} from one concurrency to a higher one",
        cause,
    )


def _inversion_cause(kind: str, inversions: Sequence[LoadInversion]) -> str:
    """What the engine kind says causes these inversions, and whether their configs ran with its
    fix; empty where the kind knows no cause."""
    server = KINDS.get(kind)  # a dataset may come from a gridbench that knew other kinds
    known = server.load_inversion_cause if server else None
    if server is None or known is None:
        return ""
    without = [i.config for i in inversions if known.fix_flag not in i.serve_command]
    return f"On {server.label} this is typically {known.cause}, off with `{known.fix_flag}`: " + (
        f"{and_list(without)} ran without it." if without else "these cells ran with it, so look elsewhere."
    )


# --- (b) acceptance ≈ 0 with speculation on ---------------------------------------------


def acceptance_near_zero(dataset: pd.DataFrame, natural: pd.DataFrame | None) -> Check:
    """Speculative configs whose every measured cell accepted under ``ACCEPTANCE_FLOOR``."""
    findings = []
    for config, rates in _acceptance_rates([dataset, natural]).items():
        if rates and max(rates) < ACCEPTANCE_FLOOR:
            findings.append(f"{config} accepts at most {pct(max(rates))} over {len(rates)} cells")
    return Check(
        "acceptance ≈ 0 with speculation on",
        tuple(findings),
        f"every speculative config that reports acceptance accepts {pct(ACCEPTANCE_FLOOR)} or more",
        "A drafter that is never accepted only adds work: check the draft model and its tokenizer.",
    )


def _acceptance_rates(frames: Sequence[pd.DataFrame | None]) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {}
    for frame in frames:
        if frame is None:
            continue
        spec = analysis.measured(frame)
        spec = spec[spec["speculation_method"] != "none"].dropna(subset=["acceptance_rate"])
        for config, rate in zip(spec["config"], spec["acceptance_rate"].astype(float), strict=True):
            rates.setdefault(config, []).append(rate)
    return rates


# --- (c) decode above the bandwidth roofline without speculation -------------------------


def decode_above_roofline(dataset: pd.DataFrame, bandwidth_gb_s: float | None) -> Check:
    title = "decode above the bandwidth roofline without speculation"
    if not bandwidth_gb_s:
        return Check(title, (), "not checked: `study.hardware.memory_bandwidth_gb_s` is not set")
    ok = analysis.measured(dataset)
    plain = ok[ok["speculation_method"] == "none"].dropna(subset=["decode_tps", "active_weight_gb"])
    findings = []
    for config in analysis.config_order(plain):
        rows = plain[plain["config"] == config]
        fastest = rows.loc[rows["decode_tps"].astype(float).idxmax()]
        ceiling = float(bandwidth_gb_s) / float(fastest["active_weight_gb"])
        if float(fastest["decode_tps"]) > ceiling:
            findings.append(
                f"{config} decodes {num(fastest['decode_tps'])} tok/s at depth "
                f"{fastest['context_tokens']}, above its {num(ceiling)} tok/s ceiling"
            )
    return Check(
        title,
        tuple(findings),
        "no non-speculative config decodes faster than bandwidth ÷ active weights allows",
        "One read of the weights per token cannot go faster: the config's `active_weight_gb` or "
        "the study's bandwidth is wrong, or the engine speculates without being told to.",
    )


# --- (d) errored or incomplete requests, failed cells ------------------------------------


def errors_and_incomplete(dataset: pd.DataFrame, natural: pd.DataFrame | None) -> Check:
    findings = []
    failed = int((dataset["status"] == "failed").sum())
    if natural is not None:
        failed += int((natural["status"] == "failed").sum())
        ok = analysis.measured(natural)
        bad = ok[(ok["errored"].fillna(0).astype(int) > 0) | (ok["incomplete"].fillna(0).astype(int) > 0)]
        findings += [
            f"{r.config} {r.prompt_class} c={r.concurrency}: {r.errored} errored, "
            f"{r.incomplete} incomplete of {r.requests} requests"
            for r in bad.itertuples()
        ]
    if failed:
        findings.insert(
            0, f"{failed} cell{'s' if failed != 1 else ''} failed (listed under Failed and skipped cells)"
        )
    return Check(
        "errors or incomplete requests",
        tuple(findings),
        "every scheduled cell was measured and every request completed",
    )


# --- (e) a spread larger than the effect it qualifies ------------------------------------


def noisy_ratios(dataset: pd.DataFrame, study: StudyInfo) -> list[tuple[str, analysis.SpeedupPoint]]:
    """Every ratio the report calls a difference (speedups over baselines, engines on the same
    weights, quantizations) whose spread is larger than its distance from 1. The tie rule
    compares the means, the ratio's spread compounds both relative spreads: a large spread on
    the smaller value can let the first call a difference the second does not support."""
    comparisons = (
        analysis.speedups(dataset, study)
        + analysis.engine_comparisons(dataset)
        + analysis.quantization_comparisons(dataset)
    )
    return [
        (f"{c.config} ÷ {c.baseline}", p)
        for c in comparisons
        for p in c.points
        if p.outcome != analysis.TIE and p.speedup.std > abs(p.speedup.mean - 1)
    ]


CALLED = {analysis.WIN: "faster", analysis.LOSS: "slower"}


def spread_exceeds_effect(dataset: pd.DataFrame, study: StudyInfo) -> Check:
    findings = tuple(
        f"{name} at depth {p.depth}: {ratio_text(p.speedup)}, called {CALLED[p.outcome]}"
        for name, p in noisy_ratios(dataset, study)
    )
    return Check(
        "a spread larger than the effect it qualifies",
        findings,
        "every ratio called faster or slower is further from 1 than its ± spread",
        "Read these as ties: more runs per depth (`benchy.runs`) would decide them.",
    )


# --- (f) an engine that restarted within a config ----------------------------------------


def engine_restarts(dataset: pd.DataFrame, natural: pd.DataFrame | None) -> Check:
    """Configs whose measured cells ran on more than one engine start: a cell records its
    engine's start-up, so two distinct (fingerprint, start-up) pairs are two starts."""
    starts: dict[str, list[float]] = {}
    for start in analysis.engine_starts([dataset, natural]):
        for config in start.configs:
            starts.setdefault(config, []).append(start.startup_s)
    findings = tuple(
        f"{config}: {len(times)} starts ({', '.join(f'{num(t, 1)} s' for t in times)})"
        for config, times in starts.items()
        if len(times) > 1
    )
    return Check(
        "engine restarted within a config",
        findings,
        "every config's measured cells ran on one engine start"
        if starts
        else "not checked: no measured cell recorded its engine's start-up",
        "Cells on different starts can differ by more than the runs' spread (warm-up, compiled "
        "graphs, caches): compare them with care.",
    )


# --- (g) configs measured on different machines -------------------------------------------


def machines_differ(dataset: pd.DataFrame, natural: pd.DataFrame | None) -> Check:
    """The configs each machine measured, a machine named by its GPUs' UUIDs (the cells'
    telemetry): flagged when the measured cells ran on more than one."""
    machines: dict[str, list[str]] = {}
    for frame in (dataset, natural):
        if frame is None or "telemetry_gpu_ids" not in frame:
            continue
        for gpus, cells in analysis.measured(frame).groupby("telemetry_gpu_ids", sort=False):
            configs = machines.setdefault(str(gpus), [])
            configs.extend(c for c in cells["config"].unique() if c not in configs)
    findings = tuple(
        f"{and_list(configs)} on {', '.join(gpu[:GPU_ID_CHARS] for gpu in gpus.split(', '))}"
        for gpus, configs in machines.items()
    )
    return Check(
        "configs measured on different machines",
        findings if len(machines) > 1 else (),
        "every measured cell ran on the same GPUs"
        if machines
        else "not checked: no measured cell recorded its GPUs' UUIDs",
        "Two machines of one kind can differ by more than any config (host CPU, neighbours; a "
        "small model leaves the GPU mostly idle, and the host sets the pace): compare configs "
        "measured on one machine, or measure the baseline again on each.",
    )


# --- (h) a cached context that answers no faster than a cold one --------------------------


def cached_context_not_faster(dataset: pd.DataFrame) -> Check:
    """Depth cells whose prefix-cache cell's TTFT is not below the cold cell's."""
    if "ttft_ms_cached" not in dataset:
        measured = dataset.iloc[0:0]
    else:
        measured = dataset[dataset["ttft_ms_cached"].notna() & dataset["ttft_ms"].notna()]
    findings = tuple(
        f"{row.config} at depth {row.context_tokens}: cold {num(row.ttft_ms)} ms, cached "
        f"{num(row.ttft_ms_cached)} ms"
        for row in measured.itertuples()
        if row.ttft_ms_cached >= row.ttft_ms
    )
    return Check(
        "cached context no faster than cold",
        findings,
        f"every cached-context cell ({len(measured)}) answered sooner than its cold cell"
        if len(measured)
        else "not checked: no prefix-cache pass measured",
        "The cache missed or bought nothing: prefix caching off or evicted on the engine, a "
        "context shorter than its cache block, or a loaded host; the engine log's prompt token "
        "counts say whether the context was reused.",
    )


# --- (i) greedy speculation that changed an output ---------------------------------------


def speculation_not_lossless(quality: pd.DataFrame | None) -> Check:
    """Speculative configs whose greedy outputs differ from their baseline's: speculative
    decoding verifies every drafted token against the target, so at temperature 0 it must
    answer exactly what the baseline answers, up to a near-tie that rounding may flip."""
    if quality is None or "lossless_mismatches" not in quality:
        compared = pd.DataFrame()
    else:
        compared = quality[quality["lossless_prompts"].fillna(0) > 0]
    findings, at_ties = [], []
    for row in compared.itertuples():
        beyond_ties = getattr(row, "lossless_mismatches_beyond_ties", row.lossless_mismatches)
        beyond_ties = row.lossless_mismatches if pd.isna(beyond_ties) else beyond_ties
        where = f"{row.lossless_mismatched_classes}: prompt class@first differing " + (
            "token" if pd.notna(row.lossless_first_difference_tokens) else "character"
        )
        if beyond_ties > 0:
            findings.append(
                f"{row.config}: {row.lossless_mismatches} of {row.lossless_prompts} greedy outputs "
                f"differ from {row.baseline}'s ({where})"
            )
        elif row.lossless_mismatches > 0:
            at_ties.append(f"{row.config} ({where})")
    passed = (
        f"every speculative config's greedy outputs ({len(compared)}) equal its baseline's"
        if len(compared)
        else "not checked: no speculative config with a baseline has quality results"
    )
    if at_ties:
        passed += (
            f", but where {and_list(at_ties)} part from it, the baseline's token stood within "
            f"{NEAR_TIE_NATS} nats of its runner-up: a near-tie that rounding in batched "
            "verification flips, not a speculation error"
        )
    return Check(
        "speculation not lossless",
        tuple(findings),
        passed,
        "Greedy speculation must change no token: a difference at a confident token is a "
        "verification bug or a draft that shares state with the target; the first differing "
        "position and the baseline's margin there (nats) say where to look.",
    )
