"""The load dataset: one row per (config, prompt class, arrival process, rate) cell, and each
config's capacity under the SLO.

Rows come from the open-loop harness's raw JSON (schema ``gridbench.load.v1``: its
``summary``, and its ``requests`` judged by the study's SLO as it stands, so a changed SLO
re-judges without re-measuring) and the provenance record beside it; a cell without them is
a failed row with the reason from its failure record. ``rows_from_results`` and
``capacities`` are pure; the files are read and written only by ``build_from_plan``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from gridbench.aggregate import dataset
from gridbench.aggregate.records import (
    CellFailure,
    ConfigIdentity,
    EnergyColumns,
    Failure,
    MeasuredCell,
    Provenance,
    Row,
    column_names,
    optional_float,
    optional_str,
    read_cells,
    row_columns,
    typed_document,
)
from gridbench.cells.kinds.load import LoadCellPlan
from gridbench.cells.plan import LoadPlan
from gridbench.errors import ResultFileError
from gridbench.harness.goodput import LagSplit, LoadSummary, SloOutcome, lag_split, slo_outcome
from gridbench.harness.load import SCHEMA, LoadResult
from gridbench.harness.stats import OK

CellKey = tuple[str, str, str, float]


@dataclass(frozen=True)
class Coordinates:
    prompt_class: str
    arrival: str
    rate_req_s: float


@dataclass(frozen=True)
class LoadRow:
    """One row of the load dataset; a column group that does not apply is None."""

    config: ConfigIdentity
    coordinates: Coordinates
    status: dataset.Status
    summary: LoadSummary | None = None
    lag: LagSplit | None = None
    slo: SloOutcome | None = None
    provenance: Provenance | None = None
    energy: EnergyColumns | None = None
    failure: Failure | None = None
    files: dataset.Files | None = None


COLUMNS = row_columns(LoadRow)
INTEGERS = [
    "num_speculative_tokens",
    "requests",
    "ok",
    "slo_percentile",
    "gpu_count",
    "exit_code",
    *dataset.ENERGY_INTEGERS,
]
BOOLEANS = [*dataset.BOOLEAN_COLUMNS, "saturated", "slo_met"]
FLOATS = [
    "active_weight_gb",
    "rate_req_s",
    *[c for c in column_names(LoadSummary) if c not in ("requests", "ok", "saturated")],
    *column_names(LagSplit),
    *[c for c in column_names(SloOutcome) if c not in ("slo_percentile", "slo_met", "binding_constraint")],
    *[c for c in dataset.FLOAT_COLUMNS if c in dataset.PROVENANCE],
    *dataset.ENERGY_FLOATS,
]


def parse_result(document: object, cell: LoadCellPlan) -> LoadResult:
    """A load cell's result; ResultFileError for one that is not this cell's."""
    if not isinstance(document, Mapping) or document.get("schema") != SCHEMA:
        raise ResultFileError(f"not a load result (schema {SCHEMA})")
    result = typed_document(LoadResult, document, f"not a load result (schema {SCHEMA})")
    found = (result.config, result.prompt_class, result.arrival, result.rate_req_s)
    if found != cell.key:
        raise ResultFileError(f"holds cell {found}, expected {cell.key}")
    return result


def ok_output_tokens(result: LoadResult) -> int | None:
    """The output tokens of the ok requests, as the summary's throughput counts them."""
    counts = [
        r.record.output_tokens
        for r in result.requests
        if r.record.status == OK and r.record.output_tokens is not None
    ]
    return sum(counts) if counts else None


def rows_from_results(
    plan: LoadPlan,
    results: Mapping[CellKey, MeasuredCell[LoadResult]],
    failures: Mapping[CellKey, CellFailure],
) -> list[LoadRow]:
    rows = []
    for cell in plan.cells:
        identity = ConfigIdentity.from_config(plan.configs[cell.config])
        where = Coordinates(cell.prompt_class, cell.arrival, cell.rate_req_s)
        result = results.get(cell.key)
        if result is not None:
            output = result.output
            rows.append(
                LoadRow(
                    identity,
                    where,
                    dataset.Status("ok"),
                    output.summary,
                    lag_split(output.requests),
                    slo_outcome(output.requests, plan.slo),
                    result.provenance.provenance,
                    EnergyColumns.of(
                        result.provenance.telemetry, ok_output_tokens(output), plan.gpu_hour_usd
                    ),
                    files=dataset.Files(cell.files.raw, cell.files.provenance, log_path=cell.files.log),
                )
            )
            continue
        failure = failures.get(cell.key)
        rows.append(
            LoadRow(
                identity,
                where,
                dataset.Status("failed", (failure.reason if failure else None) or dataset.NOT_RUN),
                failure=failure.details if failure else None,
                files=dataset.Files(
                    failure_path=dataset.failure_path(cell, failure), log_path=cell.files.log
                ),
            )
        )
    return rows


@dataclass(frozen=True)
class MeasuredLevel:
    """A measured load cell as the capacity reads it, from a row or from the dataset."""

    config: str
    prompt_class: str
    arrival: str
    rate_req_s: float
    slo_met: bool
    saturated: bool
    goodput_req_s: float | None
    goodput_tok_s: float | None
    binding_constraint: str | None

    @classmethod
    def of_row(cls, row: LoadRow) -> MeasuredLevel | None:
        if row.summary is None or row.slo is None:
            return None
        where, slo = row.coordinates, row.slo
        return cls(
            row.config.config,
            where.prompt_class,
            where.arrival,
            where.rate_req_s,
            slo.slo_met,
            row.summary.saturated,
            slo.goodput_req_s,
            slo.goodput_tok_s,
            slo.binding_constraint,
        )

    @classmethod
    def of_record(cls, row: Row) -> MeasuredLevel | None:
        """A row of the load dataset (a frame's record); None for a failed cell."""
        if row["status"] != "ok":
            return None
        return cls(
            str(row["config"]),
            str(row["prompt_class"]),
            str(row["arrival"]),
            float(row["rate_req_s"] or 0),
            bool(row["slo_met"]),
            bool(row["saturated"]),
            optional_float(row["goodput_req_s"]),
            optional_float(row["goodput_tok_s"]),
            optional_str(row["binding_constraint"]),
        )


@dataclass(frozen=True)
class Capacity:
    """The highest measured rate at which a config met the SLO, for one class and process."""

    config: str
    prompt_class: str
    arrival: str
    capacity_req_s: float | None  # None: no measured rate met it
    goodput_req_s: float | None  # at that rate
    goodput_tok_s: float | None  # at that rate
    binding_constraint: str | None  # at that rate
    first_failing_req_s: float | None  # the lowest measured rate above it that missed it
    saturated_from_req_s: float | None  # the lowest measured rate that saturated


def capacities(rows: Sequence[LoadRow]) -> list[Capacity]:
    """Each config's capacity from the dataset's rows (failed cells left out)."""
    return capacities_of([level for row in rows if (level := MeasuredLevel.of_row(row))])


def frame_capacities(frame: pd.DataFrame) -> list[Capacity]:
    """Each config's capacity from the load dataset as written."""
    records = frame.astype(object).to_dict("records")
    return capacities_of([level for row in records if (level := MeasuredLevel.of_record(row))])


def capacities_of(levels: Sequence[MeasuredLevel]) -> list[Capacity]:
    """Per (config, class, process), in the levels' order: the highest passing rate below the
    first failing one (a rate passing above a failing one is noise, not capacity)."""
    groups: dict[tuple[str, str, str], list[MeasuredLevel]] = {}
    for level in levels:
        groups.setdefault((level.config, level.prompt_class, level.arrival), []).append(level)
    found = []
    for (config, prompt_class, arrival), measured in groups.items():
        ordered = sorted(measured, key=lambda level: level.rate_req_s)
        failing = next((level for level in ordered if not level.slo_met), None)
        passing = [lv for lv in ordered if failing is None or lv.rate_req_s < failing.rate_req_s]
        best = passing[-1] if passing else None
        saturated = next((level for level in ordered if level.saturated), None)
        found.append(
            Capacity(
                config,
                prompt_class,
                arrival,
                best.rate_req_s if best else None,
                best.goodput_req_s if best else None,
                best.goodput_tok_s if best else None,
                best.binding_constraint if best else None,
                failing.rate_req_s if failing else None,
                saturated.rate_req_s if saturated else None,
            )
        )
    return found


def to_frame(rows: Sequence[LoadRow]) -> pd.DataFrame:
    return dataset.typed_frame(rows, COLUMNS, integers=INTEGERS, floats=FLOATS, booleans=BOOLEANS)


def build_from_plan(plan: LoadPlan, *, csv: Path, parquet: Path) -> tuple[pd.DataFrame, list[Capacity]]:
    results, failures = read_cells(plan.cells, lambda cell: cell.key, parse_result)
    rows = rows_from_results(plan, results, failures)
    frame = to_frame(rows)
    dataset.write_frame(frame, csv=csv, parquet=parquet)
    return frame, capacities(rows)
