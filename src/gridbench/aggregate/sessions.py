"""The sessions dataset: one row per (config, prompt class, concurrent sessions) cell and turn.

Rows come from the session harness's raw JSON (schema ``gridbench.sessions.v1``: its per-turn
``summary``) and the provenance record beside it; a cell without them gives a failed row per
turn with the reason from its failure record. ``rows_from_results`` is pure; the files are
read and written only by ``build_from_plan``.
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
    Failure,
    MeasuredCell,
    Provenance,
    column_names,
    read_cells,
    row_columns,
    typed_document,
)
from gridbench.cells.kinds.session import SessionCellPlan
from gridbench.cells.plan import SessionPlan
from gridbench.errors import ResultFileError
from gridbench.harness.sessions import SCHEMA, SessionResult, TurnSummary

CellKey = tuple[str, str, int]


@dataclass(frozen=True)
class Coordinates:
    prompt_class: str
    sessions: int


@dataclass(frozen=True)
class CachedCounts:
    """Which engine counter gave the cached prompt tokens, or why some turn has none."""

    cached_prompt_tokens_key: str | None = None
    cached_prompt_tokens_missing: str | None = None


@dataclass(frozen=True)
class SessionRow:
    """One turn of one session cell; a column group that does not apply is None."""

    config: ConfigIdentity
    coordinates: Coordinates
    turn: TurnSummary  # a failed cell's row: its turn's number, nothing measured
    status: dataset.Status
    counts: CachedCounts | None = None
    provenance: Provenance | None = None
    failure: Failure | None = None
    files: dataset.Files | None = None


COLUMNS = row_columns(SessionRow)
INTEGERS = ["num_speculative_tokens", "sessions", "turn", "ok", "gpu_count", "exit_code"]
FLOATS = [
    "active_weight_gb",
    *[c for c in column_names(TurnSummary) if c not in ("turn", "ok")],
    *[c for c in dataset.FLOAT_COLUMNS if c in dataset.PROVENANCE],
]


def parse_result(document: object, cell: SessionCellPlan) -> SessionResult:
    """A session cell's result; ResultFileError for one that is not this cell's."""
    if not isinstance(document, Mapping) or document.get("schema") != SCHEMA:
        raise ResultFileError(f"not a sessions result (schema {SCHEMA})")
    result = typed_document(SessionResult, document, f"not a sessions result (schema {SCHEMA})")
    found = (result.config, result.prompt_class, result.sessions)
    if found != cell.key:
        raise ResultFileError(f"holds cell {found}, expected {cell.key}")
    return result


def _unmeasured_turn(turn: int) -> TurnSummary:
    return TurnSummary(turn, 0, None, None, None, None, None, None, None, None)


def rows_from_results(
    plan: SessionPlan,
    results: Mapping[CellKey, MeasuredCell[SessionResult]],
    failures: Mapping[CellKey, CellFailure],
) -> list[SessionRow]:
    rows = []
    for cell in plan.cells:
        identity = ConfigIdentity.from_config(plan.configs[cell.config])
        where = Coordinates(cell.prompt_class, cell.sessions)
        result = results.get(cell.key)
        if result is not None:
            output = result.output
            counts = CachedCounts(output.cached_prompt_tokens_key, output.cached_prompt_tokens_missing)
            files = dataset.Files(cell.files.raw, cell.files.provenance, log_path=cell.files.log)
            rows += [
                SessionRow(
                    identity,
                    where,
                    turn,
                    dataset.Status("ok"),
                    counts,
                    result.provenance.provenance,
                    files=files,
                )
                for turn in output.summary
            ]
            continue
        failure = failures.get(cell.key)
        status = dataset.Status("failed", (failure.reason if failure else None) or dataset.NOT_RUN)
        files = dataset.Files(failure_path=dataset.failure_path(cell, failure), log_path=cell.files.log)
        rows += [
            SessionRow(
                identity,
                where,
                _unmeasured_turn(turn),
                status,
                failure=failure.details if failure else None,
                files=files,
            )
            for turn in range(1, plan.turns + 1)
        ]
    return rows


def to_frame(rows: Sequence[SessionRow]) -> pd.DataFrame:
    return dataset.typed_frame(rows, COLUMNS, integers=INTEGERS, floats=FLOATS)


def build_from_plan(plan: SessionPlan, *, csv: Path, parquet: Path) -> pd.DataFrame:
    results, failures = read_cells(plan.cells, lambda cell: cell.key, parse_result)
    frame = to_frame(rows_from_results(plan, results, failures))
    dataset.write_frame(frame, csv=csv, parquet=parquet)
    return frame
