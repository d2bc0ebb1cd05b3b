"""The natural-prompt dataset: one row per (config, prompt class, concurrency) cell.

Rows come from the harness's raw JSON (schema ``gridbench.natural.v1``, its ``summary``)
and the provenance record beside it; a cell without them is a failed row with the
reason from its failure record. ``rows_from_results`` is pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from gridbench.aggregate import dataset
from gridbench.aggregate.records import (
    AcceptanceColumns,
    CellFailure,
    CellReadings,
    ConfigIdentity,
    EnergyColumns,
    Failure,
    MeasuredCell,
    Provenance,
    RecordedAcceptance,
    read_cells,
    row_columns,
    typed_document,
)
from gridbench.cells.kinds.natural import NaturalCellPlan
from gridbench.cells.plan import NaturalPlan
from gridbench.errors import ResultFileError
from gridbench.util import codec

SCHEMA = "gridbench.natural.v1"
LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "req_tok_s")
STATISTICS = ("mean", "p50", "p95", "p99")


@dataclass(frozen=True)
class Coordinates:
    prompt_class: str
    concurrency: int


@dataclass(frozen=True)
class Summary:
    """The harness's summary of a cell's requests: its raw file's ``summary``, but the
    percentile warnings (``Warnings``)."""

    requests: int | None = None
    ok: int | None = None
    errored: int | None = None
    incomplete: int | None = None
    error_rate: float | None = None
    wall_s: float | None = None
    output_tok_s: float | None = None
    output_tokens_p50: int | None = None
    ttft_ms_mean: float | None = None
    ttft_ms_p50: float | None = None
    ttft_ms_p95: float | None = None
    ttft_ms_p99: float | None = None
    tpot_ms_mean: float | None = None
    tpot_ms_p50: float | None = None
    tpot_ms_p95: float | None = None
    tpot_ms_p99: float | None = None
    itl_ms_mean: float | None = None
    itl_ms_p50: float | None = None
    itl_ms_p95: float | None = None
    itl_ms_p99: float | None = None
    e2e_ms_mean: float | None = None
    e2e_ms_p50: float | None = None
    e2e_ms_p95: float | None = None
    e2e_ms_p99: float | None = None
    req_tok_s_mean: float | None = None
    req_tok_s_p50: float | None = None
    req_tok_s_p95: float | None = None
    req_tok_s_p99: float | None = None


@dataclass(frozen=True)
class Warnings:
    """Why a summary's percentiles mean little, as one column."""

    percentile_warnings: str | None = None  # "; "-joined


@dataclass(frozen=True)
class HarnessSummary:
    """The raw file's ``summary``: the measured columns under their own keys, and why a
    percentile means little (a list)."""

    measured: Summary = field(default_factory=Summary, metadata=codec.INLINE)
    percentile_warnings: tuple[str, ...] | None = None

    @property
    def warnings(self) -> Warnings:
        return Warnings("; ".join(self.percentile_warnings) if self.percentile_warnings else None)


@dataclass(frozen=True)
class Settings:
    max_tokens: int | None = None
    temperature: float | None = None


@dataclass(frozen=True)
class RecordedRequest:
    """A request record of the raw file, as far as its ending and its tokens go."""

    status: str | None = None
    finish_reason: str | None = None
    output_tokens: int | None = None


@dataclass(frozen=True)
class Endings:
    """How the cell's ok requests ended: on the model's own EOS ("stop") or at max_tokens.
    A class whose answers end on EOS well short of max_tokens measures short answers, not
    steady-state decode."""

    ended_on_eos: int | None = None
    ended_on_eos_share: float | None = None  # of the ok requests

    @classmethod
    def of(cls, requests: Sequence[RecordedRequest]) -> Endings:
        ok = [r for r in requests if r.status == "ok"]
        if not ok:
            return cls()
        stops = sum(r.finish_reason == "stop" for r in ok)
        return cls(stops, round(stops / len(ok), 6))


@dataclass(frozen=True)
class NaturalRow:
    """One row of the natural-prompt dataset; a column group that does not apply is None."""

    config: ConfigIdentity
    coordinates: Coordinates
    status: dataset.Status
    summary: Summary | None = None
    warnings: Warnings | None = None
    settings: Settings | None = None
    endings: Endings | None = None
    acceptance: AcceptanceColumns | None = None
    provenance: Provenance | None = None
    energy: EnergyColumns | None = None
    failure: Failure | None = None
    files: dataset.Files | None = None


COLUMNS = row_columns(NaturalRow)
INTEGERS = [
    "num_speculative_tokens",
    "concurrency",
    "requests",
    "ok",
    "errored",
    "incomplete",
    "output_tokens_p50",
    "max_tokens",
    "ended_on_eos",
    "gpu_count",
    "exit_code",
    *dataset.ENERGY_INTEGERS,
]
FLOATS = [
    "active_weight_gb",
    "error_rate",
    "wall_s",
    "output_tok_s",
    "temperature",
    "ended_on_eos_share",
    *[f"{m}_{s}" for m in LATENCIES for s in STATISTICS],
    *[c for c in dataset.FLOAT_COLUMNS if c in dataset.ACCEPTANCE + dataset.PROVENANCE],
    *dataset.ENERGY_FLOATS,
]


@dataclass(frozen=True)
class NaturalResult:
    """The harness's raw file (schema ``gridbench.natural.v1``) as far as the dataset reads
    it: which cell it holds, its settings and summary, and its own acceptance window (None
    without speculation)."""

    config: str | None = None
    prompt_class: str | None = None
    concurrency: int | None = None
    settings: Settings | None = None
    requests: tuple[RecordedRequest, ...] = ()
    summary: HarnessSummary = field(default_factory=HarnessSummary)
    spec_decode: RecordedAcceptance | None = None

    @classmethod
    def from_json(cls, document: object) -> NaturalResult:
        """The result in a parsed JSON document; ResultFileError when it is not one."""
        if (
            not isinstance(document, Mapping)
            or document.get("schema") != SCHEMA
            or not isinstance(document.get("summary"), Mapping)
        ):
            raise ResultFileError(f"not a natural-prompt result (schema {SCHEMA} with a summary)")
        return typed_document(cls, document, f"not a natural-prompt result (schema {SCHEMA})")


def ok_output_tokens(requests: Sequence[RecordedRequest]) -> int | None:
    """The output tokens of the ok requests, as the harness's throughput counts them; None
    where none has a count."""
    counts = [r.output_tokens for r in requests if r.status == "ok" and r.output_tokens is not None]
    return sum(counts) if counts else None


def measured_row(
    identity: ConfigIdentity,
    cell: NaturalCellPlan,
    result: MeasuredCell[NaturalResult],
    gpu_hour_usd: float | None,
) -> NaturalRow:
    output = result.output
    return NaturalRow(
        identity,
        Coordinates(cell.prompt_class, cell.concurrency),
        dataset.Status("ok"),
        output.summary.measured,
        output.summary.warnings,
        output.settings or Settings(),
        Endings.of(output.requests),
        # the raw file carries the harness's own acceptance window; provenance the engine's
        acceptance=(AcceptanceColumns.from_recorded(output.spec_decode) or result.provenance.acceptance)
        or AcceptanceColumns(),
        provenance=result.provenance.provenance,
        energy=EnergyColumns.of(result.provenance.telemetry, ok_output_tokens(output.requests), gpu_hour_usd),
        files=dataset.Files(cell.files.raw, cell.files.provenance, log_path=cell.files.log),
    )


def parse_result(document: object, cell: NaturalCellPlan) -> NaturalResult:
    """A natural cell's result; ResultFileError for one that is not this cell's."""
    result = NaturalResult.from_json(document)
    found = (result.config, result.prompt_class, result.concurrency)
    if found != cell.key:
        raise ResultFileError(f"holds cell {found}, expected {cell.key}")
    return result


def rows_from_results(
    plan: NaturalPlan,
    results: Mapping[tuple[str, str, int], MeasuredCell[NaturalResult]],
    failures: Mapping[tuple[str, str, int], CellFailure],
) -> list[NaturalRow]:
    rows = []
    for cell in plan.cells:
        identity = ConfigIdentity.from_config(plan.configs[cell.config])
        result = results.get(cell.key)
        if result is not None:
            rows.append(measured_row(identity, cell, result, plan.gpu_hour_usd))
            continue
        failure = failures.get(cell.key)
        rows.append(
            NaturalRow(
                identity,
                Coordinates(cell.prompt_class, cell.concurrency),
                dataset.Status("failed", (failure.reason if failure else None) or dataset.NOT_RUN),
                failure=failure.details if failure else None,
                files=dataset.Files(
                    failure_path=dataset.failure_path(cell, failure), log_path=cell.files.log
                ),
            )
        )
    return rows


def to_frame(rows: Sequence[NaturalRow]) -> pd.DataFrame:
    return dataset.typed_frame(rows, COLUMNS, integers=INTEGERS, floats=FLOATS)


def read_natural_cells(plan: NaturalPlan) -> CellReadings[tuple[str, str, int], NaturalResult]:
    return read_cells(plan.cells, lambda cell: cell.key, parse_result)


def build_from_plan(plan: NaturalPlan, *, csv: Path, parquet: Path) -> pd.DataFrame:
    results, failures = read_natural_cells(plan)
    frame = to_frame(rows_from_results(plan, results, failures))
    dataset.write_frame(frame, csv=csv, parquet=parquet)
    return frame
