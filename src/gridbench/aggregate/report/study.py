"""What was measured and on what: method, environment and provenance, configs."""

from __future__ import annotations

import json
from collections.abc import Iterable

import pandas as pd

from gridbench.aggregate import analysis
from gridbench.aggregate.report.markdown import code, depth_list, table
from gridbench.aggregate.text import DASH
from gridbench.aggregate.weights_origin import origin_text
from gridbench.config.grid import BenchySettings, Grid
from gridbench.harness.prompts import NaturalSettings


def _extra_body(settings: BenchySettings | NaturalSettings) -> str:
    """The extra body its requests send, as the method's clause (none: no clause)."""
    body = settings.extra_body
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
        f"{'with' if b.warmup else 'without'} its warm-up request{_extra_body(b)}, "
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
            f"{_extra_body(n)}; "
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
    text = table(("", ""), _environment_rows(grid, dataset, natural))
    engines = _engine_rows(dataset, natural)
    if engines:
        text += "\n\n" + table(
            ("engine", "kind (runtime)", "image", "image digest", "engine version"), engines
        )
    return text


def _environment_rows(
    grid: Grid, dataset: pd.DataFrame, natural: pd.DataFrame | None
) -> list[tuple[str, str]]:
    """Where, when and with what the study ran, and how many of its cells were measured."""
    frames = [dataset, natural]
    hardware = grid.study.hardware
    started = _distinct(frames, "started_at")
    finished = _distinct(frames, "finished_at")
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
        ("load generators", ", ".join(dict.fromkeys(_load_generators(frames))) or DASH),
        ("measured", f"{min(started)} – {max(finished)}" if started and finished else DASH),
    ]
    counts = dataset["status"].value_counts()
    cells = f"{counts.get('ok', 0)} ok, {counts.get('failed', 0)} failed, {counts.get('skipped', 0)} skipped"
    rows.append(("depth cells", cells))
    if natural is not None:
        counts = natural["status"].value_counts()
        rows.append(("natural-prompt cells", f"{counts.get('ok', 0)} ok, {counts.get('failed', 0)} failed"))
    return rows


def _load_generators(frames: Iterable[pd.DataFrame | None]) -> list[str]:
    """Each measured cell's load generator and its version, repeats included."""
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
    return generators


def _engine_rows(dataset: pd.DataFrame, natural: pd.DataFrame | None) -> list[tuple[str, str, str, str, str]]:
    """One row per distinct engine, image and version the measured cells ran on."""
    ok_frames = [analysis.measured(f) for f in (dataset, natural) if f is not None]
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
    return [
        (
            row.engine_label,
            f"{row.engine_kind} ({row.engine_runtime})",
            code(row.image),
            code(row.image_digest),
            code(row.engine_version),
        )
        for row in measured_rows[keys].drop_duplicates().itertuples(index=False)
    ]


def configs_table(grid: Grid, dataset: pd.DataFrame) -> str:
    rows = []
    meta = dataset.drop_duplicates("config")
    fingerprints = analysis.measured(dataset).drop_duplicates("config").set_index("config")["fingerprint"]
    for row in meta.itertuples():
        cfg = grid.configs.get(row.config)
        serving = flags = weights = DASH
        if cfg is not None:
            weights = origin_text(cfg.checkpoint.origin)
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
                weights,
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
            "weights",
            "speculation",
            "label",
            "serving",
            "extra serve flags",
            "fingerprint",
        ),
        rows,
    )
