"""The dataset: one row per (config, depth) cell of the grid, measured, failed or skipped.

A depth cell with a prefix-cache cell (benchy.prefix_cache_pass) carries that cell's
cached-context TTFT and prefill beside its own cold ones, and the cached cell's own status.

``rows_from_results`` is pure (records in, rows out); ``build_from_plan`` reads the files
the plan names (any of them may be missing: that cell becomes a failed row) and writes
CSV, strict JSON and Parquet.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from gridbench.aggregate.records import (
    AcceptanceColumns,
    CellFailure,
    ConfigIdentity,
    EnergyColumns,
    Failure,
    MeasuredCell,
    PlannedCell,
    Provenance,
    Row,
    Scalar,
    column_names,
    read_cells,
    row_columns,
    row_record,
)
from gridbench.cells.kinds import cell_file_pattern, result_folders
from gridbench.cells.kinds.benchy import DepthCellPlan
from gridbench.cells.plan import DepthPlan
from gridbench.errors import ResultFileError
from gridbench.harness.benchy import (
    CACHED_REQUIRED_METRICS,
    REQUIRED_METRICS,
    UNMEASURED,
    BenchyEntry,
    BenchyResult,
    entries_at,
)
from gridbench.util import codec
from gridbench.util.files import atomic_write_bytes, atomic_write_text

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Status:
    status: str  # ok, failed or skipped
    reason: str | None = None


@dataclass(frozen=True)
class Measures:
    """llama-benchy's measures at a depth; tps = tokens per second (the seeds' names)."""

    context_tokens: int
    prompt_tokens: int | None = None
    gen_tokens: int | None = None
    concurrency: int | None = None
    runs: int | None = None
    prefill_tps: float | None = None
    prefill_tps_std: float | None = None
    decode_tps: float | None = None
    decode_tps_std: float | None = None
    peak_tps: float | None = None
    peak_tps_std: float | None = None
    # per request: below the totals when concurrency > 1 (a request shares the engine)
    prefill_req_tps: float | None = None
    prefill_req_tps_std: float | None = None
    decode_req_tps: float | None = None
    decode_req_tps_std: float | None = None
    peak_req_tps: float | None = None
    peak_req_tps_std: float | None = None
    ttft_ms: float | None = None
    ttft_ms_std: float | None = None
    ttfr_ms: float | None = None
    ttfr_ms_std: float | None = None
    est_ppt_ms: float | None = None
    est_ppt_ms_std: float | None = None


@dataclass(frozen=True)
class Cached:
    """The prefix-cache cell of the same (config, depth)."""

    cached_status: str
    cached_reason: str | None = None
    ttft_ms_cached: float | None = None
    ttft_ms_cached_std: float | None = None
    prefill_tps_cached: float | None = None
    prefill_tps_cached_std: float | None = None
    ttft_cached_speedup: float | None = None  # cold ttft_ms / ttft_ms_cached


@dataclass(frozen=True)
class Files:
    raw_path: str | None = None
    provenance_path: str | None = None
    failure_path: str | None = None
    log_path: str | None = None


@dataclass(frozen=True)
class CachedFiles:
    cached_raw_path: str | None = None
    cached_failure_path: str | None = None
    cached_log_path: str | None = None


@dataclass(frozen=True)
class DepthRow:
    """One row of the dataset; a column group that does not apply is None (null columns)."""

    config: ConfigIdentity
    status: Status
    measures: Measures
    cached: Cached | None = None
    acceptance: AcceptanceColumns | None = None
    provenance: Provenance | None = None
    energy: EnergyColumns | None = None
    failure: Failure | None = None
    files: Files | None = None
    cached_files: CachedFiles | None = None


CONFIG_META = column_names(ConfigIdentity)
STATUS = column_names(Status)
MEASURES = column_names(Measures)
# the prefix-cache cell of the same (config, depth): None where the config has no pass
CACHED = column_names(Cached)
# llama-benchy takes the server's prompt-token count when it lies within 20 % of the count
# it expects (pp in the cached phase); the server counts the cached context too, so below
# this depth/pp its cached prefill throughput counts the context's tokens as prefilled
CACHED_PREFILL_MIN_DEPTH_RATIO = 0.2
ACCEPTANCE = column_names(AcceptanceColumns)
PROVENANCE = column_names(Provenance)
ENERGY = column_names(EnergyColumns)
ENERGY_INTEGERS = ["telemetry_gpus", "output_tokens_measured"]
ENERGY_FLOATS = [
    c
    for c in ENERGY
    if c not in (*ENERGY_INTEGERS, "energy_source", "throttle_reasons", "telemetry_gpu_ids", "telemetry_note")
]
FAILURE = column_names(Failure)
FILES = column_names(Files)
CACHED_FILES = column_names(CachedFiles)
COLUMNS = row_columns(DepthRow)
INTEGER_COLUMNS = [
    "num_speculative_tokens",
    "context_tokens",
    "prompt_tokens",
    "gen_tokens",
    "concurrency",
    "runs",
    "gpu_count",
    "exit_code",
    *ENERGY_INTEGERS,
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
    *ENERGY_FLOATS,
]
BOOLEAN_COLUMNS = ["engine_reused", "prefix_cache_reset"]
DATASET_VERSION = 5  # 5: the energy columns
NOT_RUN = "no result: the cell did not run (or its result files were removed)"


def benchy_entry(result: BenchyResult, depth: int, required: Sequence[str] = REQUIRED_METRICS) -> BenchyEntry:
    """llama-benchy's measured entry for ``depth`` (not the prefix-cache context phase)."""
    entries, _ = entries_at(result, depth)
    if len(entries) != 1:
        raise ResultFileError(f"{len(entries)} llama-benchy results for depth {depth}, expected 1")
    nulls = [m for m in required if entries[0].metric(m).mean is None]
    if nulls:
        raise ResultFileError(f"llama-benchy measured no {', '.join(nulls)} (null)")
    return entries[0]


def measures(result: BenchyResult, depth: int) -> Measures:
    """The measure columns of one successful cell."""
    entry = benchy_entry(result, depth)
    return Measures(
        context_tokens=depth,
        prompt_tokens=entry.prompt_size,
        gen_tokens=entry.response_size,
        concurrency=entry.concurrency,
        runs=entry.tg_throughput.count,
        prefill_tps=entry.pp_throughput.mean,
        prefill_tps_std=entry.pp_throughput.std,
        decode_tps=entry.tg_throughput.mean,
        decode_tps_std=entry.tg_throughput.std,
        peak_tps=entry.peak_throughput.mean,
        peak_tps_std=entry.peak_throughput.std,
        prefill_req_tps=entry.pp_req_throughput.mean,
        prefill_req_tps_std=entry.pp_req_throughput.std,
        decode_req_tps=entry.tg_req_throughput.mean,
        decode_req_tps_std=entry.tg_req_throughput.std,
        peak_req_tps=entry.peak_req_throughput.mean,
        peak_req_tps_std=entry.peak_req_throughput.std,
        ttft_ms=entry.e2e_ttft.mean,
        ttft_ms_std=entry.e2e_ttft.std,
        ttfr_ms=entry.ttfr.mean,
        ttfr_ms_std=entry.ttfr.std,
        est_ppt_ms=entry.est_ppt.mean,
        est_ppt_ms_std=entry.est_ppt.std,
    )


def depth_energy(result: MeasuredCell[BenchyResult], depth: int, gpu_hour_usd: float | None) -> EnergyColumns:
    """The energy columns of a measured depth cell: each of its measured requests (one
    per-request decode value each, runs x concurrency) generated ``gen_tokens``; llama-benchy's
    warm-up and latency probes are in the window but not counted."""
    entry = benchy_entry(result.output, depth)
    requests, tokens = entry.tg_req_throughput.count, entry.response_size
    counted = requests * tokens if requests and tokens else None
    return EnergyColumns.of(result.provenance.telemetry, counted, gpu_hour_usd)


def cached_entry(result: BenchyResult, depth: int) -> BenchyEntry:
    """The measured (second-phase) entry of a prefix-cache cell's llama-benchy result."""
    if result.prefix_caching_enabled is False:
        raise ResultFileError("a llama-benchy result without --enable-prefix-caching")
    return benchy_entry(result, depth, CACHED_REQUIRED_METRICS)


def cached_measures(result: BenchyResult, depth: int, cold_ttft_ms: float | None) -> Cached:
    """The cached-context columns of a measured prefix-cache cell; a null metric is None."""
    entry = cached_entry(result, depth)
    ttft = entry.e2e_ttft
    pp = entry.prompt_size
    prefill = entry.pp_throughput if pp and depth >= CACHED_PREFILL_MIN_DEPTH_RATIO * pp else UNMEASURED
    return Cached(
        cached_status="ok",
        ttft_ms_cached=ttft.mean,
        ttft_ms_cached_std=ttft.std,
        prefill_tps_cached=prefill.mean,
        prefill_tps_cached_std=prefill.std,
        ttft_cached_speedup=cold_ttft_ms / ttft.mean if cold_ttft_ms and ttft.mean else None,
    )


def failure_path(cell: PlannedCell, failure: CellFailure | None) -> str | None:
    """The cell's failure file where the cell wrote one (not for a reason the reader found)."""
    return cell.files.failure if failure and failure.recorded else None


def _cached_columns(
    cell: DepthCellPlan,
    result: MeasuredCell[BenchyResult] | None,
    failure: CellFailure | None,
    cold_ttft_ms: float | None,
) -> tuple[Cached, CachedFiles]:
    if result is not None:
        return (
            cached_measures(result.output, cell.depth, cold_ttft_ms),
            CachedFiles(cached_raw_path=cell.files.raw, cached_log_path=cell.files.log),
        )
    return (
        Cached("failed", (failure.reason if failure else None) or NOT_RUN),
        CachedFiles(cached_failure_path=failure_path(cell, failure), cached_log_path=cell.files.log),
    )


def rows_from_results(
    plan: DepthPlan,
    results: Mapping[tuple[str, int], MeasuredCell[BenchyResult]],
    failures: Mapping[tuple[str, int], CellFailure],
    cached: Mapping[tuple[str, int], MeasuredCell[BenchyResult]] | None = None,
    cached_failures: Mapping[tuple[str, int], CellFailure] | None = None,
) -> list[DepthRow]:
    """Rows in plan order: a measured row for each cell in ``results``, a failed one with
    its failure (or NOT_RUN) otherwise. ``cached`` and ``cached_failures`` do the same for
    the plan's prefix-cache cells."""
    cached, cached_failures = cached or {}, cached_failures or {}
    cached_cells = {cell.key: cell for cell in plan.cached_cells}
    rows = []
    for cell in plan.cells:
        identity = ConfigIdentity.from_config(plan.configs[cell.config])
        result = results.get(cell.key)
        if result is not None:
            row = DepthRow(
                identity,
                Status("ok"),
                measures(result.output, cell.depth),
                acceptance=result.provenance.acceptance or AcceptanceColumns(),
                provenance=result.provenance.provenance,
                energy=depth_energy(result, cell.depth, plan.gpu_hour_usd),
                files=Files(cell.files.raw, cell.files.provenance, log_path=cell.files.log),
            )
        else:
            failure = failures.get(cell.key)
            row = DepthRow(
                identity,
                Status("failed", (failure.reason if failure else None) or NOT_RUN),
                Measures(cell.depth),
                failure=failure.details if failure else None,
                files=Files(failure_path=failure_path(cell, failure), log_path=cell.files.log),
            )
        cached_cell = cached_cells.get(cell.key)
        if cached_cell is not None:
            cached_columns, cached_files = _cached_columns(
                cached_cell, cached.get(cell.key), cached_failures.get(cell.key), row.measures.ttft_ms
            )
            row = replace(row, cached=cached_columns, cached_files=cached_files)
        rows.append(row)
    for skipped in plan.skipped:
        rows.append(
            DepthRow(
                ConfigIdentity.from_config(plan.configs[skipped.cell.config]),
                Status("skipped", skipped.reason),
                Measures(skipped.cell.depth),
            )
        )
    return rows


def typed_frame(
    rows: Iterable[DataclassInstance],
    columns: Sequence[str],
    *,
    integers: Sequence[str],
    floats: Sequence[str],
    booleans: Sequence[str] = BOOLEAN_COLUMNS,
) -> pd.DataFrame:
    """Rows of column groups as a frame with nullable dtypes (ints stay ints with missing
    values); every other column is a string."""
    frame = pd.DataFrame.from_records([row_record(row) for row in rows], columns=list(columns))
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


def to_frame(rows: Sequence[DepthRow]) -> pd.DataFrame:
    """Typed frame in report order: configs as declared, depths ascending (skipped in place)."""
    frame = typed_frame(rows, COLUMNS, integers=INTEGER_COLUMNS, floats=FLOAT_COLUMNS)
    order = {name: i for i, name in enumerate(dict.fromkeys(frame["config"]))}
    rank = frame["config"].map(order)
    frame = frame.assign(_rank=rank).sort_values(["_rank", "context_tokens"], kind="stable")
    return frame.drop(columns="_rank").reset_index(drop=True)


def plain_records(frame: pd.DataFrame) -> list[Row]:
    """The rows as plain Python values, None for every missing one (never NaN)."""
    records: list[Row] = frame.astype(object).where(frame.notna(), None).to_dict("records")
    return records


# a row of the JSON dataset: its columns' values, the per-position rates as a list
JsonRow = dict[str, Scalar | list[float]]


@dataclass(frozen=True)
class ConfigEntry:
    """One config's entry of the JSON dataset (the seeds' shape), with null for every
    missing value."""

    meta: dict[str, Scalar]  # the config's identity columns
    version: str | None  # llama-benchy's
    dataset_version: int
    partial: bool  # whether any of the config's cells failed
    cells: dict[str, int]  # how many are ok, failed and skipped
    rows: tuple[JsonRow, ...]


def to_json_document(frame: pd.DataFrame, versions: Mapping[str, str | None]) -> dict[str, ConfigEntry]:
    """The seeds' {config: {meta, version, rows}} shape: one entry per config."""
    row_columns = [c for c in COLUMNS if c not in CONFIG_META]
    groups: dict[str, list[Row]] = {}
    for record in plain_records(frame):
        groups.setdefault(str(record["config"]), []).append(record)
    document = {}
    for config, group in groups.items():
        rows = []
        for record in group:
            row: JsonRow = {c: record[c] for c in row_columns}
            per_position = record["acceptance_per_position"]
            if per_position is not None:
                row["acceptance_per_position"] = json.loads(str(per_position))
            rows.append(row)
        statuses = [r["status"] for r in rows]
        document[config] = ConfigEntry(
            meta={c: group[0][c] for c in CONFIG_META},
            version=versions.get(config),
            dataset_version=DATASET_VERSION,
            partial="failed" in statuses,
            cells={s: statuses.count(s) for s in ("ok", "failed", "skipped")},
            rows=tuple(rows),
        )
    return document


def document_text(document: Mapping[str, ConfigEntry]) -> str:
    """The JSON document with one row per line: readable, and written by the C encoder
    (json's indent= falls back to the pure-Python one, several times slower)."""

    def dump(value: object) -> str:
        return json.dumps(value, allow_nan=False)

    entries = []
    for config, entry in document.items():
        # the rows are written one per line below; the codec need not walk them
        head = [
            f"    {dump(key)}: {dump(value)},"
            for key, value in codec.to_json(replace(entry, rows=())).items()
            if key != "rows"
        ]
        rows = ",\n".join(f"      {dump(row)}" for row in entry.rows)
        entries.append(f"  {dump(config)}: {{\n" + "\n".join(head) + f'\n    "rows": [\n{rows}\n    ]\n  }}')
    return "{\n" + ",\n".join(entries) + "\n}\n"


def read_benchy_cells(
    cells: Sequence[DepthCellPlan],
    entry: Callable[[BenchyResult, int], BenchyEntry] = benchy_entry,
) -> tuple[
    dict[tuple[str, int], MeasuredCell[BenchyResult]],
    dict[tuple[str, int], CellFailure],
    dict[str, str | None],
]:
    """The files of these planned cells: (results, failures, llama-benchy version per config).
    ``entry`` finds a result's measured entry, and raises ResultFileError when it has none."""

    def parse(document: object, cell: DepthCellPlan) -> BenchyResult:
        result = BenchyResult.from_json(document)
        entry(result, cell.depth)
        return result

    results, failures = read_cells(cells, lambda cell: cell.key, parse)
    versions: dict[str, str | None] = {}
    for (config, _), result in results.items():
        versions.setdefault(config, result.output.version)
    return results, failures, versions


def write_frame(frame: pd.DataFrame, *, csv: Path, parquet: Path) -> None:
    atomic_write_bytes(csv, frame.to_csv(index=False).encode())
    tmp = parquet.with_name(f".{parquet.name}.tmp")
    frame.to_parquet(tmp, index=False)
    tmp.replace(parquet)


def foreign_files(root: Path = Path()) -> list[str]:
    """Files under the results' folders that no cell could have written."""
    found = []
    cell_file = cell_file_pattern()
    for sub in result_folders():
        for path in sorted((root / sub).rglob("*")):
            relative = path.relative_to(root).as_posix()
            if path.is_file() and not cell_file.fullmatch(relative):
                found.append(relative)
    return found


def build_from_plan(plan: DepthPlan, *, csv: Path, json_path: Path, parquet: Path) -> pd.DataFrame:
    for path in foreign_files():
        log.warning(f"{path}: not a result file of any cell; it is left out of the dataset")
    results, failures, versions = read_benchy_cells(plan.cells)
    cached, cached_failures, _ = read_benchy_cells(plan.cached_cells, cached_entry)
    frame = to_frame(rows_from_results(plan, results, failures, cached, cached_failures))
    write_frame(frame, csv=csv, parquet=parquet)
    atomic_write_text(json_path, document_text(to_json_document(frame, versions)))
    return frame
