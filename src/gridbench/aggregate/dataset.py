"""The dataset: one row per (config, depth) cell of the grid, measured, failed or skipped.

A depth cell with a prefix-cache cell (benchy.prefix_cache_pass) carries that cell's
cached-context TTFT and prefill beside its own cold ones, and the cached cell's own status.

``rows_from_results`` is pure (records in, rows out); ``build_from_plan`` reads the files
the plan names (any of them may be missing: that cell becomes a failed row) and writes
CSV, strict JSON and Parquet.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import re
import shlex
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from gridbench.errors import ResultFileError
from gridbench.files import atomic_write_bytes, atomic_write_text
from gridbench.harness.benchy import CACHED_REQUIRED_METRICS, REQUIRED_METRICS, entries_at

log = logging.getLogger(__name__)

# llama-benchy metric -> dataset column (the seeds' names; tps = tokens per second)
METRICS = {
    "pp_throughput": "prefill_tps",
    "tg_throughput": "decode_tps",
    "peak_throughput": "peak_tps",
    # per request: below the totals when concurrency > 1 (a request shares the engine)
    "pp_req_throughput": "prefill_req_tps",
    "tg_req_throughput": "decode_req_tps",
    "peak_req_throughput": "peak_req_tps",
    "e2e_ttft": "ttft_ms",
    "ttfr": "ttfr_ms",
    "est_ppt": "est_ppt_ms",
}
CONFIG_META = [
    "config",
    "config_label",
    "engine",
    "engine_label",
    "engine_kind",
    "engine_runtime",
    "checkpoint",
    "quantization",
    "weights",
    "active_weight_gb",
    "speculation",
    "speculation_label",
    "speculation_method",
    "num_speculative_tokens",
]
STATUS = ["status", "reason"]
MEASURES = ["context_tokens", "prompt_tokens", "gen_tokens", "concurrency", "runs"] + [
    col for name in METRICS.values() for col in (name, f"{name}_std")
]
# the prefix-cache cell of the same (config, depth): None where the config has no pass
CACHED = [
    "cached_status",
    "cached_reason",
    "ttft_ms_cached",
    "ttft_ms_cached_std",
    "prefill_tps_cached",
    "prefill_tps_cached_std",
    "ttft_cached_speedup",  # cold ttft_ms / ttft_ms_cached
]
# llama-benchy takes the server's prompt-token count when it lies within 20 % of the count
# it expects (pp in the cached phase); the server counts the cached context too, so below
# this depth/pp its cached prefill throughput counts the context's tokens as prefilled
CACHED_PREFILL_MIN_DEPTH_RATIO = 0.2
ACCEPTANCE = [
    "acceptance_rate",
    "mean_acceptance_length",
    "acceptance_per_position",
    "spec_drafts",
    "spec_draft_tokens",
    "spec_accepted_tokens",
]
PROVENANCE = [
    "image",
    "image_id",
    "image_digest",
    "engine_version",
    "engine_startup_s",
    "engine_reused",
    "serve_command",
    "gpu",
    "gpu_count",
    "driver",
    "hostname",
    "gridbench_version",
    "load_generator",
    "load_generator_version",
    "fingerprint",
    "prefix_cache_reset",
    "started_at",
    "finished_at",
    "bench_wall_s",
]
FAILURE = ["error_type", "exit_code", "failed_at"]
FILES = ["raw_path", "provenance_path", "failure_path", "log_path"]
CACHED_FILES = ["cached_raw_path", "cached_failure_path", "cached_log_path"]
COLUMNS = CONFIG_META + STATUS + MEASURES + CACHED + ACCEPTANCE + PROVENANCE + FAILURE + FILES + CACHED_FILES
INTEGER_COLUMNS = [
    "num_speculative_tokens",
    "context_tokens",
    "prompt_tokens",
    "gen_tokens",
    "concurrency",
    "runs",
    "gpu_count",
    "exit_code",
]
FLOAT_COLUMNS = [
    "active_weight_gb",
    *[c for c in MEASURES if c.endswith(("_tps", "_ms", "_std"))],
    *[c for c in CACHED if c not in ("cached_status", "cached_reason")],
    "acceptance_rate",
    "mean_acceptance_length",
    "spec_drafts",
    "spec_draft_tokens",
    "spec_accepted_tokens",
    "engine_startup_s",
    "bench_wall_s",
]
BOOLEAN_COLUMNS = ["engine_reused", "prefix_cache_reset"]
DATASET_VERSION = 4
NOT_RUN = "no result: the cell did not run (or its result files were removed)"


def config_meta(config: Mapping[str, Any]) -> dict[str, Any]:
    """Identity columns of a config (ServingConfig.to_dict())."""
    spec = config["speculation"]
    return {
        "config": config["name"],
        "config_label": config["label"],
        "engine": config["engine"]["name"],
        "engine_label": config["engine"]["label"],
        "engine_kind": config["engine"]["kind"],
        "engine_runtime": config["engine"]["runtime"],
        "checkpoint": config["checkpoint"]["name"],
        "quantization": config["checkpoint"]["quantization"],
        "weights": config["checkpoint"]["weights"],
        "active_weight_gb": config["checkpoint"].get("active_weight_gb"),
        "speculation": spec["name"],
        "speculation_label": spec["label"],
        "speculation_method": spec["method"],
        "num_speculative_tokens": spec["num_speculative_tokens"] if spec["method"] != "none" else None,
    }


def provenance_columns(prov: Mapping[str, Any]) -> dict[str, Any]:
    """Provenance and acceptance columns of one measured cell (benchy and natural alike)."""
    engine = prov.get("engine") or {}
    host = prov.get("host") or {}
    versions = prov.get("versions") or {}
    bench = prov.get("bench") or {}
    argv = engine.get("serve_argv")
    row = {
        "image": engine.get("image"),
        "image_id": engine.get("image_id"),
        "image_digest": engine.get("image_digest"),
        "engine_version": engine.get("version"),
        "engine_startup_s": engine.get("startup_s"),
        "engine_reused": engine.get("reused"),
        "serve_command": engine.get("serve_command") or (shlex.join(argv) if argv else None),
        "gpu": host.get("gpu"),
        "gpu_count": host.get("gpu_count"),
        "driver": host.get("driver"),
        "hostname": host.get("hostname"),
        "gridbench_version": versions.get("gridbench"),
        "load_generator": versions.get("load_generator"),
        "load_generator_version": versions.get("load_generator_version"),
        "fingerprint": prov.get("fingerprint"),
        "prefix_cache_reset": prov.get("prefix_cache_reset"),
        "started_at": prov.get("started_at"),
        "finished_at": prov.get("finished_at"),
        "bench_wall_s": bench.get("wall_s"),
    }
    return {**row, **acceptance_columns(prov.get("spec_decode"))}


def acceptance_columns(spec: Mapping[str, Any] | None) -> dict[str, Any]:
    spec = spec or {}
    per_pos = spec.get("acceptance_per_position")
    return {
        "acceptance_rate": spec.get("acceptance_rate"),
        "mean_acceptance_length": spec.get("mean_acceptance_length"),
        "acceptance_per_position": json.dumps(per_pos) if per_pos is not None else None,
        "spec_drafts": spec.get("delta_drafts"),
        "spec_draft_tokens": spec.get("delta_draft_tokens"),
        "spec_accepted_tokens": spec.get("delta_accepted_tokens"),
    }


def failure_columns(failure: Mapping[str, Any] | None, default_reason: str) -> dict[str, Any]:
    failure = failure or {}
    return {
        "reason": failure.get("reason") or default_reason,
        "error_type": failure.get("error_type"),
        "exit_code": failure.get("exit_code"),
        "failed_at": failure.get("failed_at"),
    }


def _metric(entry: Mapping[str, Any], name: str) -> tuple[float | None, float | None, int | None]:
    value = entry.get(name)
    if not isinstance(value, Mapping):
        return None, None, None
    values = value.get("values")
    return value.get("mean"), value.get("std"), len(values) if isinstance(values, list) else None


def benchy_entry(
    raw: Mapping[str, Any], depth: int, required: Sequence[str] = REQUIRED_METRICS
) -> Mapping[str, Any]:
    """llama-benchy's measured entry for ``depth`` (not the prefix-cache context phase)."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("benchmarks"), list):
        raise ResultFileError("not a llama-benchy result (no 'benchmarks' list)")
    entries, _ = entries_at(raw, depth)
    if len(entries) != 1:
        raise ResultFileError(f"{len(entries)} llama-benchy results for depth {depth}, expected 1")
    nulls = [m for m in required if (entries[0].get(m) or {}).get("mean") is None]
    if nulls:
        raise ResultFileError(f"llama-benchy measured no {', '.join(nulls)} (null)")
    entry: Mapping[str, Any] = entries[0]
    return entry


def measured_row(raw: Mapping[str, Any], prov: Mapping[str, Any], depth: int) -> dict[str, Any]:
    """Measure, acceptance and provenance columns of one successful cell."""
    entry = benchy_entry(raw, depth)
    row: dict[str, Any] = {
        "context_tokens": depth,
        "prompt_tokens": entry.get("prompt_size"),
        "gen_tokens": entry.get("response_size"),
        "concurrency": entry.get("concurrency"),
    }
    for metric, column in METRICS.items():
        row[column], row[f"{column}_std"], runs = _metric(entry, metric)
        if metric == "tg_throughput":
            row["runs"] = runs
    return {**row, **provenance_columns(prov)}


def cached_entry(raw: Mapping[str, Any], depth: int) -> Mapping[str, Any]:
    """The measured (second-phase) entry of a prefix-cache cell's llama-benchy result."""
    if isinstance(raw, Mapping) and raw.get("prefix_caching_enabled") is False:
        raise ResultFileError("a llama-benchy result without --enable-prefix-caching")
    return benchy_entry(raw, depth, CACHED_REQUIRED_METRICS)


def cached_row(raw: Mapping[str, Any], depth: int, cold_ttft_ms: float | None) -> dict[str, Any]:
    """The cached-context columns of a measured prefix-cache cell; a null metric is None."""
    entry = cached_entry(raw, depth)
    ttft, ttft_std, _ = _metric(entry, "e2e_ttft")
    prefill, prefill_std, _ = _metric(entry, "pp_throughput")
    pp = entry.get("prompt_size")
    if not pp or depth < CACHED_PREFILL_MIN_DEPTH_RATIO * pp:
        prefill = prefill_std = None
    return {
        "cached_status": "ok",
        "cached_reason": None,
        "ttft_ms_cached": ttft,
        "ttft_ms_cached_std": ttft_std,
        "prefill_tps_cached": prefill,
        "prefill_tps_cached_std": prefill_std,
        "ttft_cached_speedup": cold_ttft_ms / ttft if cold_ttft_ms and ttft else None,
    }


def _cached_columns(
    cell: Mapping[str, Any] | None,
    result: tuple[Mapping[str, Any], Mapping[str, Any]] | None,
    failure: Mapping[str, Any] | None,
    cold_ttft_ms: float | None,
) -> dict[str, Any]:
    if cell is None:
        return {}
    files = {"cached_log_path": cell.get("log")}
    if result is not None:
        return {
            **files,
            "cached_raw_path": cell.get("raw"),
            **cached_row(result[0], cell["depth"], cold_ttft_ms),
        }
    return {
        **files,
        "cached_status": "failed",
        "cached_reason": (failure or {}).get("reason") or NOT_RUN,
        "cached_failure_path": cell.get("failure") if failure and failure.get("cell") else None,
    }


def rows_from_results(
    plan: Mapping[str, Any],
    results: Mapping[tuple[str, int], tuple[Mapping[str, Any], Mapping[str, Any]]],
    failures: Mapping[tuple[str, int], Mapping[str, Any]],
    cached: Mapping[tuple[str, int], tuple[Mapping[str, Any], Mapping[str, Any]]] | None = None,
    cached_failures: Mapping[tuple[str, int], Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Rows in plan order. ``results`` maps (config, depth) to (raw, provenance) for cells
    that succeeded; ``failures`` to their failure record (or a synthesized one) otherwise.
    ``cached`` and ``cached_failures`` do the same for the plan's prefix-cache cells."""
    cached, cached_failures = cached or {}, cached_failures or {}
    cached_cells = {(c["config"], c["depth"]): c for c in plan.get("cached_cells", [])}
    rows = []
    for cell in plan["cells"]:
        key = (cell["config"], cell["depth"])
        base = {
            **config_meta(plan["configs"][cell["config"]]),
            "context_tokens": cell["depth"],
            "log_path": cell.get("log"),
        }
        if key in results:
            raw, prov = results[key]
            row = {
                **base,
                "status": "ok",
                "reason": None,
                "raw_path": cell.get("raw"),
                "provenance_path": cell.get("provenance"),
                **measured_row(raw, prov, cell["depth"]),
            }
        else:
            failure = failures.get(key)
            row = {
                **base,
                "status": "failed",
                "failure_path": cell.get("failure") if failure and failure.get("cell") else None,
                **failure_columns(failure, NOT_RUN),
            }
        row.update(
            _cached_columns(
                cached_cells.get(key), cached.get(key), cached_failures.get(key), row.get("ttft_ms")
            )
        )
        rows.append(row)
    for cell in plan.get("skipped", []):
        rows.append(
            {
                **config_meta(plan["configs"][cell["config"]]),
                "context_tokens": cell["depth"],
                "status": "skipped",
                "reason": cell["reason"],
            }
        )
    return rows


def typed_frame(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    *,
    integers: Sequence[str],
    floats: Sequence[str],
    booleans: Sequence[str] = BOOLEAN_COLUMNS,
) -> pd.DataFrame:
    """Rows as a frame with nullable dtypes (ints stay ints with missing values); every
    other column is a string."""
    frame = pd.DataFrame.from_records(list(rows), columns=list(columns))
    for column in frame.columns:
        if column in integers:
            frame[column] = frame[column].astype("Int64")
        elif column in floats:
            frame[column] = pd.to_numeric(frame[column]).astype("Float64")
        elif column in booleans:
            frame[column] = frame[column].astype("boolean")
        else:
            frame[column] = frame[column].astype("string")
    return frame


def to_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Typed frame in report order: configs as declared, depths ascending (skipped in place)."""
    frame = typed_frame(rows, COLUMNS, integers=INTEGER_COLUMNS, floats=FLOAT_COLUMNS)
    order = {name: i for i, name in enumerate(dict.fromkeys(frame["config"]))}
    rank = frame["config"].map(order)
    frame = frame.assign(_rank=rank).sort_values(["_rank", "context_tokens"], kind="stable")
    return frame.drop(columns="_rank").reset_index(drop=True)


def plain_records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows as plain Python values, None for every missing one (never NaN)."""
    records: list[dict[str, Any]] = frame.astype(object).where(frame.notna(), None).to_dict("records")
    return records


def to_json_document(frame: pd.DataFrame, versions: Mapping[str, str | None]) -> dict[str, Any]:
    """The seeds' {config: {meta, version, rows}} shape, with null for every missing value.
    ``partial`` says whether any of the config's cells failed."""
    row_columns = [c for c in COLUMNS if c not in CONFIG_META]
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in plain_records(frame):
        groups.setdefault(record["config"], []).append(record)
    document: dict[str, Any] = {}
    for config, group in groups.items():
        rows = []
        for record in group:
            row = {c: record[c] for c in row_columns}
            if row["acceptance_per_position"] is not None:
                row["acceptance_per_position"] = json.loads(row["acceptance_per_position"])
            rows.append(row)
        statuses = [r["status"] for r in rows]
        document[config] = {
            "meta": {c: group[0][c] for c in CONFIG_META},
            "version": versions.get(config),
            "dataset_version": DATASET_VERSION,
            "partial": "failed" in statuses,
            "cells": {s: statuses.count(s) for s in ("ok", "failed", "skipped")},
            "rows": rows,
        }
    return document


def document_text(document: Mapping[str, Any]) -> str:
    """The JSON document with one row per line: readable, and written by the C encoder
    (json's indent= falls back to the pure-Python one, several times slower)."""

    def dump(value: Any) -> str:
        return json.dumps(value, allow_nan=False)

    entries = []
    for config, entry in document.items():
        head = [f"    {dump(key)}: {dump(value)}," for key, value in entry.items() if key != "rows"]
        rows = ",\n".join(f"      {dump(row)}" for row in entry["rows"])
        entries.append(f"  {dump(config)}: {{\n" + "\n".join(head) + f'\n    "rows": [\n{rows}\n    ]\n  }}')
    return "{\n" + ",\n".join(entries) + "\n}\n"


def load_json(path: Path) -> Any:
    """A JSON file, or None when it does not exist."""
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ResultFileError(
            f"{path}: not valid JSON ({err})", hint=f"delete {path} and rerun: the workflow redoes that cell"
        ) from err


def unreadable(path: str, err: ResultFileError) -> dict[str, Any]:
    """A failure record for a result file that exists but cannot be used."""
    log.warning(f"{path}: {err.message}; the cell counts as failed")
    return {"reason": f"{path}: {err.message}; delete it and rerun the workflow to redo the cell"}


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: parsed JSON holds no cycles, and with thousands
    of documents alive its passes cost as much as the parsing."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


CellKey = TypeVar("CellKey", bound=tuple[Any, ...])
RawCells = tuple[
    dict[CellKey, tuple[dict[str, Any], dict[str, Any]]],  # results: (raw, provenance)
    dict[CellKey, dict[str, Any]],  # failure records
]


def read_cells(
    cells: Sequence[Mapping[str, Any]],
    key: Callable[[Mapping[str, Any]], CellKey],
    check: Callable[[Mapping[str, Any], Mapping[str, Any]], object],
) -> RawCells[CellKey]:
    """The files of planned cells, depth and natural alike: each cell's result with its
    provenance, or its failure record. ``check(raw, cell)`` raises ResultFileError for a
    result that is not this cell's (a foreign file must not pass as a result)."""
    results: dict[CellKey, tuple[dict[str, Any], dict[str, Any]]] = {}
    failures: dict[CellKey, dict[str, Any]] = {}
    with collector_paused():
        for cell in cells:
            name = key(cell)
            try:
                raw = load_json(Path(cell["raw"]))
                prov = load_json(Path(cell["provenance"]))
                if raw is not None and prov is not None:
                    check(raw, cell)
                    results[name] = (raw, prov)
                    continue
            except ResultFileError as err:
                failures[name] = unreadable(cell["raw"], err)
                continue
            failure = load_json(Path(cell["failure"])) if cell.get("failure") else None
            if failure:
                failures[name] = failure
            elif raw is not None:
                failures[name] = {
                    "reason": f"{cell['provenance']} is missing; rerun the workflow to redo the cell"
                }
    return results, failures


def read_benchy_cells(
    cells: Sequence[Mapping[str, Any]],
    entry: Callable[[Mapping[str, Any], int], Mapping[str, Any]] = benchy_entry,
) -> tuple[
    dict[tuple[str, int], tuple[dict[str, Any], dict[str, Any]]],
    dict[tuple[str, int], dict[str, Any]],
    dict[str, str | None],
]:
    """The files of these planned cells: (results, failures, llama-benchy version per config).
    ``entry`` finds a result's measured entry, and raises ResultFileError when it has none."""
    results, failures = read_cells(
        cells, lambda cell: (cell["config"], cell["depth"]), lambda raw, cell: entry(raw, cell["depth"])
    )
    versions: dict[str, str | None] = {}
    for (config, _), (raw, _) in results.items():
        versions.setdefault(config, raw.get("version"))
    return results, failures, versions


def write_frame(frame: pd.DataFrame, *, csv: Path, parquet: Path) -> None:
    atomic_write_bytes(csv, frame.to_csv(index=False).encode())
    tmp = parquet.with_name(f".{parquet.name}.tmp")
    frame.to_parquet(tmp, index=False)
    tmp.replace(parquet)


_CELL_FILE = re.compile(
    r"^results/(raw/[^/]+/depth_\d+(\.pc)?|natural/[^/]+/[^/]+_c\d+)(\.provenance)?\.json$"
)


def foreign_files(root: Path = Path()) -> list[str]:
    """Files under results/raw and results/natural that no cell could have written."""
    found = []
    for sub in ("results/raw", "results/natural"):
        for path in sorted((root / sub).rglob("*")):
            relative = path.relative_to(root).as_posix()
            if path.is_file() and not _CELL_FILE.match(relative):
                found.append(relative)
    return found


def build_from_plan(plan: Mapping[str, Any], *, csv: Path, json_path: Path, parquet: Path) -> pd.DataFrame:
    for path in foreign_files():
        log.warning(f"{path}: not a result file of any cell; it is left out of the dataset")
    results, failures, versions = read_benchy_cells(plan["cells"])
    cached, cached_failures, _ = read_benchy_cells(plan.get("cached_cells", []), cached_entry)
    frame = to_frame(rows_from_results(plan, results, failures, cached, cached_failures))
    write_frame(frame, csv=csv, parquet=parquet)
    atomic_write_text(json_path, document_text(to_json_document(frame, versions)))
    return frame
