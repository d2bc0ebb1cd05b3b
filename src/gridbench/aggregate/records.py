"""What a planned cell left, read once at the edge: its result and its provenance, each
typed, or why it has none (its failure record, or what was wrong with its files).

The config identity, provenance, acceptance and failure records are also the column groups
both datasets share: their fields name the columns, in the datasets' order. The analyses read
a config's identity back from a frame's row (``ConfigIdentity.from_row``), with the helpers
below for a row's values.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import NoneType
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, get_args, get_type_hints

import cattrs
import orjson
import pandas as pd

from gridbench.cells.records import CellProvenance, FailureRecord, current_failure, current_provenance
from gridbench.cells.telemetry import Telemetry
from gridbench.config.grid import ServingConfig
from gridbench.engines.spec_metrics import Acceptance
from gridbench.errors import ResultFileError
from gridbench.layout import CellFiles
from gridbench.util import codec

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

log = logging.getLogger(__name__)

# A dataset row (column -> value) for code that is generic over a column name; a missing value
# may be None, NaN or pd.NA, which ``missing`` tells apart from a value.
Scalar = str | int | float | bool | None
Row = Mapping[str, Scalar]


def missing(value: object) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def optional_str(value: Scalar) -> str | None:
    return None if value is None or missing(value) else str(value)


def optional_float(value: Scalar) -> float | None:
    return None if value is None or missing(value) else float(value)


def optional_int(value: Scalar) -> int | None:
    return None if value is None or missing(value) else int(value)


def integer(value: Scalar) -> int:
    """A value every row has (a depth, a concurrency level) as an int."""
    if value is None:
        raise TypeError("a dataset row lacks a value it always has")
    return int(value)


def number(value: Scalar) -> float:
    """A value the row is known to have (its frame dropped the rows without) as a float."""
    if value is None:
        raise TypeError("a dataset row lacks a value it always has")
    return float(value)


def column_names(group: type[Any]) -> list[str]:
    """A column group's columns: its dataclass fields, in order."""
    return [f.name for f in fields(group)]


def row_columns(row: type[Any]) -> list[str]:
    """A dataset's columns in order: those of each column group its row type holds."""
    hints = get_type_hints(row)
    groups = [
        next(t for t in get_args(hints[f.name]) or (hints[f.name],) if t is not NoneType) for f in fields(row)
    ]
    return [name for group in groups for name in column_names(group)]


def row_record(row: DataclassInstance) -> dict[str, Scalar]:
    """A row's columns by name, from its column groups (a group that is None: no columns)."""
    record: dict[str, Scalar] = {}
    for part in _field_names(type(row)):
        group = getattr(row, part)
        if group is not None:
            record.update((column, getattr(group, column)) for column in _field_names(type(group)))
    return record


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    """dataclasses.fields' names, asked once per class: rows are built by the thousand."""
    if cls not in _FIELD_NAMES:
        _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return _FIELD_NAMES[cls]


@dataclass(frozen=True)
class ConfigIdentity:
    """Which config a row measures, the same on each of its rows (depth or natural): what the
    config is and serves."""

    config: str
    config_label: str
    engine: str
    engine_label: str
    engine_kind: str
    engine_runtime: str
    checkpoint: str
    quantization: str
    weights: str | None  # the checkpoint's declared weights
    active_weight_gb: float | None
    speculation: str
    speculation_label: str
    speculation_method: str
    num_speculative_tokens: int | None

    @classmethod
    def from_config(cls, config: ServingConfig) -> ConfigIdentity:
        spec = config.speculation
        return cls(
            config=config.name,
            config_label=config.label,
            engine=config.engine.name,
            engine_label=config.engine.label,
            engine_kind=config.engine.kind,
            engine_runtime=config.engine.runtime,
            checkpoint=config.checkpoint.name,
            quantization=config.checkpoint.quantization,
            weights=config.checkpoint.weights,
            active_weight_gb=config.checkpoint.active_weight_gb,
            speculation=spec.name,
            speculation_label=spec.label,
            speculation_method=spec.method,
            num_speculative_tokens=spec.num_speculative_tokens if spec.enabled else None,
        )

    @classmethod
    def from_row(cls, row: Row) -> ConfigIdentity:
        return cls(
            config=str(row["config"]),
            config_label=str(row["config_label"]),
            engine=str(row["engine"]),
            engine_label=str(row["engine_label"]),
            engine_kind=str(row["engine_kind"]),
            engine_runtime=str(row["engine_runtime"]),
            checkpoint=str(row["checkpoint"]),
            quantization=str(row["quantization"]),
            weights=optional_str(row.get("weights")),
            active_weight_gb=optional_float(row.get("active_weight_gb")),
            speculation=str(row["speculation"]),
            speculation_label=str(row["speculation_label"]),
            speculation_method=str(row["speculation_method"]),
            num_speculative_tokens=optional_int(row.get("num_speculative_tokens")),
        )

    @property
    def model(self) -> str:
        """The model its checkpoint holds: the declared weights, else the checkpoint itself."""
        return self.checkpoint if self.weights is None else self.weights


@dataclass(frozen=True)
class AcceptanceColumns:
    """Speculative decoding's acceptance over a cell's window (spec_metrics.Acceptance, the
    record a cell writes) as the datasets' columns: they rename its counters and hold the
    per-position rates as JSON text."""

    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    acceptance_per_position: str | None = None  # a JSON list, one rate per draft position
    spec_drafts: float | None = None
    spec_draft_tokens: float | None = None
    spec_accepted_tokens: float | None = None

    @classmethod
    def from_record(cls, spec: Acceptance | None) -> AcceptanceColumns | None:
        """The columns of a ``spec_decode`` record; None without one."""
        if spec is None:
            return None
        per_pos = spec.acceptance_per_position
        return cls(
            acceptance_rate=spec.acceptance_rate,
            mean_acceptance_length=spec.mean_acceptance_length,
            acceptance_per_position=json.dumps(list(per_pos)) if per_pos is not None else None,
            spec_drafts=spec.delta_drafts,
            spec_draft_tokens=spec.delta_draft_tokens,
            spec_accepted_tokens=spec.delta_accepted_tokens,
        )


@dataclass(frozen=True)
class Provenance:
    """Where and how a cell was measured: engine, host, versions and times."""

    image: str | None
    image_id: str | None
    image_digest: str | None
    engine_version: str | None
    engine_startup_s: float | None
    engine_reused: bool | None
    engine_compile_cache: str | None  # its start found its compile cache warm ("hit") or not ("miss")
    serve_command: str | None
    gpu: str | None
    gpu_count: int | None
    driver: str | None
    hostname: str | None
    gridbench_version: str | None
    load_generator: str | None
    load_generator_version: str | None
    fingerprint: str | None
    prefix_cache_reset: bool | None
    started_at: str | None
    finished_at: str | None
    bench_wall_s: float | None


@dataclass(frozen=True)
class ProvenanceRecord:
    """A cell's provenance file: its columns, the engine's acceptance counters (None when
    the record has none) and its GPU telemetry (None in a record older than the sampler)."""

    provenance: Provenance
    acceptance: AcceptanceColumns | None
    telemetry: Telemetry | None = None

    @classmethod
    def from_record(cls, record: CellProvenance) -> ProvenanceRecord:
        engine, host, versions = record.engine, record.host, record.versions
        provenance = Provenance(
            image=engine.image.image,
            image_id=engine.image.image_id,
            image_digest=engine.image.image_digest,
            engine_version=engine.version,
            engine_startup_s=engine.startup_s,
            engine_reused=engine.reused,
            engine_compile_cache=engine.compile_cache.found if engine.compile_cache else None,
            serve_command=engine.serve_command,
            gpu=host.gpus.gpu,
            gpu_count=host.gpus.gpu_count,
            driver=host.gpus.driver,
            hostname=host.hostname,
            gridbench_version=versions.gridbench,
            load_generator=versions.load_generator,
            load_generator_version=versions.load_generator_version,
            fingerprint=record.fingerprint,
            prefix_cache_reset=record.prefix_cache_reset,
            started_at=record.started_at,
            finished_at=record.finished_at,
            bench_wall_s=record.bench.wall_s if record.bench else None,
        )
        return cls(provenance, AcceptanceColumns.from_record(record.spec_decode), record.telemetry)


NO_TELEMETRY = (
    "no GPU telemetry in the provenance record: the cell was measured before gridbench sampled GPUs"
)
JOULES_PER_KWH = 3.6e6


def _significant(value: float, digits: int = 6) -> float:
    return float(f"{value:.{digits}g}")


@dataclass(frozen=True)
class EnergyColumns:
    """A measured cell's GPU telemetry over its window and what follows per output token.

    ``energy_j`` is the energy counter's difference where the GPUs have one, else the sampled
    power integrated (``energy_source`` says which); the window is the whole measurement
    (warm-up and pauses included), the tokens those of its measured requests. Without
    telemetry every value is None and ``telemetry_note`` says why: never zeros."""

    energy_j: float | None = None
    energy_source: str | None = None  # "counter" or "integrated"
    energy_j_integrated: float | None = None
    power_w_mean: float | None = None  # summed over the GPUs
    gpu_util_pct_mean: float | None = None
    gpu_memory_used_gib_peak: float | None = None
    sm_clock_mhz_mean: float | None = None
    temperature_c_max: float | None = None
    throttle_reasons: str | None = None  # ", "-joined, every reason seen in any sample
    telemetry_window_s: float | None = None
    telemetry_gpus: int | None = None
    telemetry_gpu_ids: str | None = None  # the GPUs' UUIDs, ", "-joined: the machine that measured
    output_tokens_measured: int | None = None  # the denominator of the per-token columns
    joules_per_output_token: float | None = None
    output_tokens_per_kwh: float | None = None
    usd_per_million_output_tokens: float | None = None  # at study.hardware.gpu_hour_usd
    telemetry_note: str | None = None  # why a value is missing

    @classmethod
    def of(
        cls, telemetry: Telemetry | None, output_tokens: int | None, gpu_hour_usd: float | None
    ) -> EnergyColumns:
        """The columns of a cell's telemetry record (None: a record older than the sampler),
        over ``output_tokens``, at a GPU-hour price (None: no cost)."""
        if telemetry is None:
            return cls(telemetry_note=NO_TELEMETRY)
        if telemetry.reason is not None:
            return cls(telemetry_note=telemetry.reason)
        energy, source = telemetry.energy_j, "counter"
        if energy is None:
            energy, source = telemetry.energy_j_integrated, "integrated"
        tokens = output_tokens or None  # no token: no per-token value
        memory = telemetry.mem_used_mib_peak
        return cls(
            energy_j=energy,
            energy_source=source if energy is not None else None,
            energy_j_integrated=telemetry.energy_j_integrated,
            power_w_mean=telemetry.power_w_mean,
            gpu_util_pct_mean=telemetry.gpu_util_pct_mean,
            gpu_memory_used_gib_peak=memory / 1024 if memory is not None else None,
            sm_clock_mhz_mean=telemetry.sm_clock_mhz_mean,
            temperature_c_max=telemetry.temperature_c_max,
            throttle_reasons=", ".join(telemetry.throttle_reasons) or None,
            telemetry_window_s=telemetry.window_s,
            telemetry_gpus=len(telemetry.gpus),
            telemetry_gpu_ids=", ".join(telemetry.gpus) or None,
            output_tokens_measured=output_tokens,
            joules_per_output_token=_significant(energy / tokens) if energy and tokens else None,
            output_tokens_per_kwh=_significant(tokens * JOULES_PER_KWH / energy)
            if energy and tokens
            else None,
            usd_per_million_output_tokens=_usd_per_million(telemetry, tokens, gpu_hour_usd),
            telemetry_note=_energy_note(energy, tokens),
        )


def _usd_per_million(telemetry: Telemetry, tokens: int | None, gpu_hour_usd: float | None) -> float | None:
    """The GPUs' time over the window at the declared price, per million output tokens."""
    if gpu_hour_usd is None or not tokens or not telemetry.window_s or not telemetry.gpus:
        return None
    gpu_hours = len(telemetry.gpus) * telemetry.window_s / 3600
    return _significant(gpu_hour_usd * gpu_hours / tokens * 1e6)


def _energy_note(energy: float | None, tokens: int | None) -> str | None:
    if energy is None:
        return "no energy: the GPUs have no energy counter and fewer than two power samples were taken"
    if not tokens:
        return "no output token was counted over the window: no per-token value"
    return None


@dataclass(frozen=True)
class Failure:
    """A failure record's columns beside its reason."""

    error_type: str | None = None
    exit_code: int | None = None
    failed_at: str | None = None


@dataclass(frozen=True)
class CellFailure:
    """Why a cell has no result: the failure record it wrote (cells.records.FailureRecord's
    document, read for its reason, the columns beside it and the cell it names), or what the
    reader found wrong with its files (only a reason)."""

    reason: str | None = None
    details: Failure = field(default_factory=Failure, metadata=codec.INLINE)
    cell: str | None = None  # as the failure record names it; None: the reader's reason

    @classmethod
    def from_record(cls, record: FailureRecord) -> CellFailure:
        return cls(record.reason, Failure(record.error_type, record.exit_code, record.failed_at), record.cell)

    @property
    def recorded(self) -> bool:
        """Whether the cell wrote a failure record (not a reason the reader found)."""
        return bool(self.cell)


Output = TypeVar("Output")
Document = TypeVar("Document")


@dataclass(frozen=True)
class MeasuredCell(Generic[Output]):
    """A cell's result: what its load generator wrote, typed (llama-benchy's result for a
    depth cell, the harness's document for a natural one), and its provenance."""

    output: Output
    provenance: ProvenanceRecord


def load_json(path: Path) -> Any:
    """A JSON file, or None when it does not exist. orjson reads a study's thousands of files in
    half the standard library's time; a file it refuses is read as the standard library reads
    it (NaN and Infinity, which llama-benchy's json.dump may write)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ResultFileError(
            f"{path}: not valid JSON ({err})", hint=f"delete {path} and rerun: the workflow redoes that cell"
        ) from err


def typed_document(cls: type[Document], document: object, what: str) -> Document:
    """The ``cls`` record a parsed JSON document holds; ResultFileError, saying ``what`` the
    document is not, where it is no JSON object or a value has another type."""
    if not isinstance(document, dict):
        raise ResultFileError(what)
    try:
        return codec.from_json(cls, document)
    except cattrs.BaseValidationError as err:
        raise ResultFileError(f"{what} ({'; '.join(cattrs.transform_error(err))})") from err


def unreadable(path: str, err: ResultFileError) -> CellFailure:
    """Why a result file that exists but cannot be used counts as a failure."""
    log.warning(f"{path}: {err.message}; the cell counts as failed")
    return CellFailure(f"{path}: {err.message}; delete it and rerun the workflow to redo the cell")


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


class PlannedCell(Protocol):
    """A plan's cell, depth or natural: the reader needs only its files."""

    @property
    def files(self) -> CellFiles: ...


Cell = TypeVar("Cell", bound=PlannedCell)
CellKey = TypeVar("CellKey", bound=Hashable)
CellReadings = tuple[dict[CellKey, MeasuredCell[Output]], dict[CellKey, CellFailure]]


def _failure(files: CellFiles) -> CellFailure | None:
    """The cell's failure record, or why it cannot be read; None where it wrote none."""
    try:
        document = load_json(Path(files.failure))
        if not document:
            return None
        record = typed_document(
            FailureRecord, current_failure(document), f"{files.failure} is not a failure record"
        )
        return CellFailure.from_record(record)
    except ResultFileError as err:
        return unreadable(files.failure, err)


def read_cells(
    cells: Sequence[Cell], key: Callable[[Cell], CellKey], parse: Callable[[Any, Cell], Output]
) -> CellReadings[CellKey, Output]:
    """The files of planned cells, depth and natural alike: each cell's result with its
    provenance, or why it has none. ``parse(raw, cell)`` types a result file's JSON, and
    raises ResultFileError for one that is not this cell's result (a foreign file must not
    pass as a result)."""
    results: dict[CellKey, MeasuredCell[Output]] = {}
    failures: dict[CellKey, CellFailure] = {}
    with collector_paused():
        for cell in cells:
            name, files = key(cell), cell.files
            try:
                raw = load_json(Path(files.raw))
                prov = load_json(Path(files.provenance))
                if raw is not None and prov is not None:
                    output = parse(raw, cell)
                    recorded = typed_document(
                        CellProvenance,
                        current_provenance(prov),
                        f"{files.provenance} is not a provenance record",
                    )
                    results[name] = MeasuredCell(output, ProvenanceRecord.from_record(recorded))
                    continue
            except ResultFileError as err:
                failures[name] = unreadable(files.raw, err)
                continue
            failure = _failure(files)
            if failure is not None:
                failures[name] = failure
            elif raw is not None:
                failures[name] = CellFailure(
                    f"{files.provenance} is missing; rerun the workflow to redo the cell"
                )
    return results, failures
