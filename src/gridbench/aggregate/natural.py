"""The natural-prompt dataset: one row per (config, prompt class, concurrency) cell.

Rows come from the harness's raw JSON (schema ``gridbench.natural.v1``: the harness's own
``LevelResult``, its summary flattened into columns) and the provenance record beside it; a cell
without them is a failed row with the reason from its failure record. ``rows_from_results`` is
pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
    read_cells,
    row_columns,
    typed_document,
)
from gridbench.cells.kinds.natural import NaturalCellPlan
from gridbench.cells.plan import NaturalPlan
from gridbench.errors import ResultFileError
from gridbench.harness.natural import SCHEMA, LevelResult
from gridbench.harness.stats import Distribution, LevelSummary, RequestRecord

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

    @classmethod
    def of(cls, summary: LevelSummary) -> Summary:
        """The harness's summary, each distribution's statistics as ``{metric}_{stat}``."""
        statistics: dict[str, float | None] = {}
        for metric in LATENCIES:
            distribution: Distribution = getattr(summary, metric)
            statistics |= {f"{metric}_{stat}": getattr(distribution, stat) for stat in STATISTICS}
        p50 = summary.output_tokens_p50
        return cls(
            requests=summary.requests,
            ok=summary.ok,
            errored=summary.errored,
            incomplete=summary.incomplete,
            error_rate=summary.error_rate,
            wall_s=summary.wall_s,
            output_tok_s=summary.output_tok_s,
            output_tokens_p50=None if p50 is None else int(p50),
            **statistics,
        )


@dataclass(frozen=True)
class Warnings:
    """Why a summary's percentiles mean little, as one column."""

    percentile_warnings: str | None = None  # "; "-joined


@dataclass(frozen=True)
class Settings:
    max_tokens: int | None = None
    temperature: float | None = None


@dataclass(frozen=True)
class Endings:
    """How the cell's ok requests ended: on the model's own EOS ("stop") or at max_tokens.
    A class whose answers end on EOS well short of max_tokens measures short answers, not
    steady-state decode."""

    ended_on_eos: int | None = None
    ended_on_eos_share: float | None = None  # of the ok requests

    @classmethod
    def of(cls, requests: Sequence[RequestRecord]) -> Endings:
        ok = [r for r in requests if r.status == "ok"]
        if not ok:
            return cls()
        stops = sum(r.finish_reason == "stop" for r in ok)
        return cls(stops, round(stops / len(ok), 6))


@dataclass(frozen=True)
class Stream:
    """What the client's stream shows of the engine's steps, over the ok requests: their output
    tokens after the first, and their text chunks after the first (the first of each is the
    prefill's). Where a chunk is one engine step (EngineKind.streams_a_step_per_chunk), tokens
    less chunks are the drafted tokens the steps accepted (aggregate/stream_steps.py)."""

    stream_tokens: int | None = None
    stream_steps: int | None = None

    @classmethod
    def of(cls, requests: Sequence[RequestRecord]) -> Stream:
        counted = [r for r in requests if r.status == "ok" and r.output_tokens is not None]
        if not counted:
            return cls()
        return cls(
            sum(max(r.output_tokens - 1, 0) for r in counted if r.output_tokens),
            sum(len(r.itl_ms) for r in counted),
        )


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
    stream: Stream | None = None
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
    "stream_tokens",
    "stream_steps",
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


def result_from_json(document: object) -> LevelResult:
    """The harness's result in a parsed JSON document; ResultFileError when it is not one."""
    if not isinstance(document, Mapping) or document.get("schema") != SCHEMA:
        raise ResultFileError(f"not a natural-prompt result (schema {SCHEMA})")
    return typed_document(LevelResult, document, f"not a natural-prompt result (schema {SCHEMA})")


def ok_output_tokens(requests: Sequence[RequestRecord]) -> int | None:
    """The output tokens of the ok requests, as the harness's throughput counts them; None
    where none has a count."""
    counts = [r.output_tokens for r in requests if r.status == "ok" and r.output_tokens is not None]
    return sum(counts) if counts else None


def measured_row(
    identity: ConfigIdentity,
    cell: NaturalCellPlan,
    result: MeasuredCell[LevelResult],
    gpu_hour_usd: float | None,
) -> NaturalRow:
    output = result.output
    warnings = output.summary.percentile_warnings
    return NaturalRow(
        identity,
        Coordinates(cell.prompt_class, cell.concurrency),
        dataset.Status("ok"),
        Summary.of(output.summary),
        Warnings("; ".join(warnings) if warnings else None),
        Settings(output.settings.max_tokens, output.settings.temperature),
        Endings.of(output.requests),
        Stream.of(output.requests),
        # the raw file carries the harness's own acceptance window; provenance the engine's
        acceptance=(AcceptanceColumns.from_record(output.spec_decode) or result.provenance.acceptance)
        or AcceptanceColumns(),
        provenance=result.provenance.provenance,
        energy=EnergyColumns.of(result.provenance.telemetry, ok_output_tokens(output.requests), gpu_hour_usd),
        files=dataset.Files(cell.files.raw, cell.files.provenance, log_path=cell.files.log),
    )


def parse_result(document: object, cell: NaturalCellPlan) -> LevelResult:
    """A natural cell's result; ResultFileError for one that is not this cell's."""
    result = result_from_json(document)
    found = (result.config, result.prompt_class, result.concurrency)
    if found != cell.key:
        raise ResultFileError(f"holds cell {found}, expected {cell.key}")
    return result


def rows_from_results(
    plan: NaturalPlan,
    results: Mapping[tuple[str, str, int], MeasuredCell[LevelResult]],
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


def read_natural_cells(plan: NaturalPlan) -> CellReadings[tuple[str, str, int], LevelResult]:
    return read_cells(plan.cells, lambda cell: cell.key, parse_result)


def build_from_plan(plan: NaturalPlan, *, csv: Path, parquet: Path) -> pd.DataFrame:
    results, failures = read_natural_cells(plan)
    frame = to_frame(rows_from_results(plan, results, failures))
    dataset.write_frame(frame, csv=csv, parquet=parquet)
    return frame
