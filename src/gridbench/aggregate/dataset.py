"""The dataset: one row per (config, depth) cell of the grid, measured or not.

``rows_from_results`` is pure (records in, rows out); ``build_from_plan`` reads the raw
files the plan names and writes CSV, strict JSON and Parquet.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from gridbench.errors import ResultFileError
from gridbench.files import atomic_write_bytes, atomic_write_json

# llama-benchy metric -> dataset column (the seeds' names; tps = tokens per second)
METRICS = {
    "pp_throughput": "prefill_tps",
    "tg_throughput": "decode_tps",
    "peak_throughput": "peak_tps",
    "e2e_ttft": "ttft_ms",
}
IDENTITY = [
    "config",
    "engine",
    "engine_label",
    "checkpoint",
    "quantization",
    "speculation",
    "speculation_label",
    "num_speculative_tokens",
    "status",
    "reason",
]
MEASURES = ["context_tokens", "prompt_tokens", "gen_tokens"] + [
    col for name in METRICS.values() for col in (name, f"{name}_std")
]
PROVENANCE = [
    "image",
    "image_digest",
    "engine_version",
    "engine_startup_s",
    "gpu",
    "driver",
    "gridbench_version",
    "llama_benchy_version",
    "fingerprint",
    "prefix_cache_reset",
    "raw_path",
    "log_path",
]
ACCEPTANCE = ["acceptance_rate", "mean_acceptance_length", "acceptance_per_position"]
COLUMNS = IDENTITY + MEASURES + ACCEPTANCE + PROVENANCE
DATASET_VERSION = 1


def config_meta(config: Mapping[str, Any]) -> dict[str, Any]:
    """Identity columns of a config (ServingConfig.to_dict())."""
    spec = config["speculation"]
    return {
        "config": config["name"],
        "engine": config["engine"]["name"],
        "engine_label": config["engine"]["label"],
        "checkpoint": config["checkpoint"]["name"],
        "quantization": config["checkpoint"]["quantization"],
        "speculation": spec["name"],
        "speculation_label": spec["label"],
        "num_speculative_tokens": spec["num_speculative_tokens"] if spec["method"] != "none" else None,
    }


def _metric(entry: Mapping[str, Any], name: str) -> tuple[float | None, float | None]:
    value = entry.get(name)
    if not isinstance(value, Mapping):
        return None, None
    return value.get("mean"), value.get("std")


def measured_row(raw: Mapping[str, Any], prov: Mapping[str, Any], depth: int) -> dict[str, Any]:
    """Measure and provenance columns of one successful cell."""
    entries = [
        b
        for b in raw.get("benchmarks", [])
        if b.get("context_size") == depth and not b.get("is_context_prefill_phase")
    ]
    if len(entries) != 1:
        raise ResultFileError(f"no llama-benchy result for depth {depth}")
    entry = entries[0]
    row: dict[str, Any] = {
        "context_tokens": depth,
        "prompt_tokens": entry.get("prompt_size"),
        "gen_tokens": entry.get("response_size"),
    }
    for metric, column in METRICS.items():
        row[column], row[f"{column}_std"] = _metric(entry, metric)
    engine = prov.get("engine", {})
    host = prov.get("host", {})
    versions = prov.get("versions", {})
    row.update(
        {
            "image": engine.get("image"),
            "image_digest": engine.get("image_digest"),
            "engine_version": engine.get("version"),
            "engine_startup_s": engine.get("startup_s"),
            "gpu": host.get("gpu"),
            "driver": host.get("driver"),
            "gridbench_version": versions.get("gridbench"),
            "llama_benchy_version": versions.get("load_generator_version"),
            "fingerprint": prov.get("fingerprint"),
            "prefix_cache_reset": prov.get("prefix_cache_reset"),
        }
    )
    spec = prov.get("spec_decode") or {}
    row["acceptance_rate"] = spec.get("acceptance_rate")
    row["mean_acceptance_length"] = spec.get("mean_acceptance_length")
    per_pos = spec.get("acceptance_per_position")
    row["acceptance_per_position"] = json.dumps(per_pos) if per_pos is not None else None
    return row


def rows_from_results(
    plan: Mapping[str, Any],
    results: Mapping[tuple[str, int], Any],
    failures: Mapping[tuple[str, int], Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """Rows in plan order. ``results`` maps (config, depth) to (raw, provenance) for cells
    that succeeded; ``failures`` to their failure record for cells that failed."""
    rows = []
    for cell in plan["cells"]:
        key = (cell["config"], cell["depth"])
        meta = config_meta(plan["configs"][cell["config"]])
        base = {**meta, "context_tokens": cell["depth"], "log_path": cell.get("log")}
        if key in results:
            raw, prov = results[key]
            rows.append(
                {
                    **base,
                    "status": "ok",
                    "reason": None,
                    "raw_path": cell.get("raw"),
                    **measured_row(raw, prov, cell["depth"]),
                }
            )
        else:
            failure = failures.get(key, {})
            rows.append(
                {
                    **base,
                    "status": "failed",
                    "reason": failure.get("reason", "no result (the cell did not run)"),
                }
            )
    for cell in plan.get("skipped", []):
        meta = config_meta(plan["configs"][cell["config"]])
        rows.append({**meta, "context_tokens": cell["depth"], "status": "skipped", "reason": cell["reason"]})
    return rows


def to_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame.from_records(rows, columns=COLUMNS)
    order = {name: i for i, name in enumerate(dict.fromkeys(frame["config"]))}
    frame = frame.sort_values(
        ["config", "context_tokens"], key=lambda s: s.map(order) if s.name == "config" else s, kind="stable"
    ).reset_index(drop=True)
    for column in ["context_tokens", "prompt_tokens", "gen_tokens", "num_speculative_tokens"]:
        frame[column] = frame[column].astype("Int64")
    floats = [c for c in MEASURES if c.endswith(("_tps", "_ms", "_std"))]
    floats += ["acceptance_rate", "mean_acceptance_length", "engine_startup_s"]
    frame[floats] = frame[floats].astype("Float64")
    frame["prefix_cache_reset"] = frame["prefix_cache_reset"].astype("boolean")
    return frame


def _clean(value: Any) -> Any:
    if value is None or value is pd.NA:
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value


def to_json_document(frame: pd.DataFrame, versions: Mapping[str, str | None]) -> dict[str, Any]:
    """The seeds' {config: {meta, version, rows}} shape, with null for every missing value."""
    meta_columns = [c for c in IDENTITY if c not in ("status", "reason")]
    document: dict[str, Any] = {}
    for config, group in frame.groupby("config", sort=False):
        first = group.iloc[0]
        rows = [{c: _clean(row[c]) for c in COLUMNS if c not in meta_columns} for _, row in group.iterrows()]
        document[config] = {
            "meta": {c: _clean(first[c]) for c in meta_columns},
            "version": versions.get(config),
            "dataset_version": DATASET_VERSION,
            "rows": rows,
        }
    return document


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ResultFileError(
            f"{path}: not valid JSON ({err})", hint=f"delete {path} and rerun: the workflow redoes that cell"
        ) from err


def build_from_plan(plan: Mapping[str, Any], *, csv: Path, json_path: Path, parquet: Path) -> pd.DataFrame:
    results, failures, versions = {}, {}, {}
    for cell in plan["cells"]:
        key = (cell["config"], cell["depth"])
        raw = _load_json(Path(cell["raw"]))
        prov = _load_json(Path(cell["provenance"]))
        if raw is not None and prov is not None:
            if not isinstance(raw, dict) or "benchmarks" not in raw:
                raise ResultFileError(
                    f"{cell['raw']}: not a llama-benchy result (no 'benchmarks')",
                    hint=f"delete {cell['raw']} and rerun",
                )
            try:
                measured_row(raw, prov, cell["depth"])
            except ResultFileError as err:
                raise ResultFileError(
                    f"{cell['raw']}: {err.message}", hint=f"delete {cell['raw']} and rerun"
                ) from err
            results[key] = (raw, prov)
            versions.setdefault(cell["config"], raw.get("version"))
        else:
            failure = _load_json(Path(cell["failure"])) if cell.get("failure") else None
            if failure:
                failures[key] = failure
    frame = to_frame(rows_from_results(plan, results, failures))
    csv.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(csv, frame.to_csv(index=False).encode())
    atomic_write_json(json_path, to_json_document(frame, versions))
    tmp = parquet.with_name(f".{parquet.name}.tmp")
    frame.to_parquet(tmp, index=False)
    tmp.replace(parquet)
    return frame
