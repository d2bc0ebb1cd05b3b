"""The natural-prompt dataset: one row per (config, prompt class, concurrency) cell.

Rows come from the harness's raw JSON (schema ``gridbench.natural.v1``, its ``summary``)
and the provenance record beside it; a cell without them is a failed row with the
reason from its failure record. ``rows_from_results`` is pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from gridbench.aggregate import dataset
from gridbench.errors import ResultFileError

SCHEMA = "gridbench.natural.v1"
LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "req_tok_s")
STATISTICS = ("mean", "p50", "p95", "p99")
SUMMARY = [
    "requests",
    "ok",
    "errored",
    "incomplete",
    "error_rate",
    "wall_s",
    "output_tok_s",
    "output_tokens_p50",
    *[f"{m}_{s}" for m in LATENCIES for s in STATISTICS],
]
SETTINGS = ["max_tokens", "temperature"]
COLUMNS = [
    *dataset.CONFIG_META,
    "prompt_class",
    "concurrency",
    *dataset.STATUS,
    *SUMMARY,
    "percentile_warnings",
    *SETTINGS,
    *dataset.ACCEPTANCE,
    *dataset.PROVENANCE,
    *dataset.FAILURE,
    *dataset.FILES,
]
INTEGERS = [
    "num_speculative_tokens",
    "concurrency",
    "requests",
    "ok",
    "errored",
    "incomplete",
    "output_tokens_p50",
    "max_tokens",
    "gpu_count",
    "exit_code",
]
FLOATS = [
    "active_weight_gb",
    "error_rate",
    "wall_s",
    "output_tok_s",
    "temperature",
    *[f"{m}_{s}" for m in LATENCIES for s in STATISTICS],
    *[c for c in dataset.FLOAT_COLUMNS if c in dataset.ACCEPTANCE + dataset.PROVENANCE],
]


def measured_row(raw: Mapping[str, Any], prov: Mapping[str, Any]) -> dict[str, Any]:
    summary = raw["summary"]
    settings = raw.get("settings") or {}
    row = {column: summary.get(column) for column in SUMMARY}
    warnings = summary.get("percentile_warnings") or []
    row["percentile_warnings"] = "; ".join(warnings) if warnings else None
    row["max_tokens"] = settings.get("max_tokens")
    row["temperature"] = settings.get("temperature")
    provenance = dataset.provenance_columns(prov)
    # the raw file carries the harness's own acceptance window; provenance the engine's
    provenance.update(dataset.acceptance_columns(raw.get("spec_decode") or prov.get("spec_decode")))
    return {**row, **provenance}


def check_raw(raw: Any, cell: Mapping[str, Any]) -> None:
    if (
        not isinstance(raw, Mapping)
        or raw.get("schema") != SCHEMA
        or not isinstance(raw.get("summary"), Mapping)
    ):
        raise ResultFileError(f"not a natural-prompt result (schema {SCHEMA} with a summary)")
    found = (raw.get("config"), raw.get("prompt_class"), raw.get("concurrency"))
    wanted = (cell["config"], cell["prompt_class"], cell["concurrency"])
    if found != wanted:
        raise ResultFileError(f"holds cell {found}, expected {wanted}")


def rows_from_results(
    plan: Mapping[str, Any],
    results: Mapping[tuple[str, str, int], tuple[Mapping[str, Any], Mapping[str, Any]]],
    failures: Mapping[tuple[str, str, int], Mapping[str, Any]],
) -> list[dict[str, Any]]:
    rows = []
    for cell in plan["cells"]:
        key = (cell["config"], cell["prompt_class"], cell["concurrency"])
        base = {
            **dataset.config_meta(plan["configs"][cell["config"]]),
            "prompt_class": cell["prompt_class"],
            "concurrency": cell["concurrency"],
            "log_path": cell.get("log"),
        }
        if key in results:
            raw, prov = results[key]
            rows.append(
                {
                    **base,
                    "status": "ok",
                    "reason": None,
                    "raw_path": cell.get("raw"),
                    "provenance_path": cell.get("provenance"),
                    **measured_row(raw, prov),
                }
            )
        else:
            failure = failures.get(key)
            rows.append(
                {
                    **base,
                    "status": "failed",
                    "failure_path": cell.get("failure") if failure and failure.get("cell") else None,
                    **dataset.failure_columns(failure, dataset.NOT_RUN),
                }
            )
    return rows


def to_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return dataset.typed_frame(rows, COLUMNS, integers=INTEGERS, floats=FLOATS)


def read_natural_cells(
    plan: Mapping[str, Any],
) -> dataset.RawCells[tuple[str, str, int]]:
    return dataset.read_cells(
        plan["cells"], lambda cell: (cell["config"], cell["prompt_class"], cell["concurrency"]), check_raw
    )


def build_from_plan(plan: Mapping[str, Any], *, csv: Path, parquet: Path) -> pd.DataFrame:
    results, failures = read_natural_cells(plan)
    frame = to_frame(rows_from_results(plan, results, failures))
    dataset.write_frame(frame, csv=csv, parquet=parquet)
    return frame
