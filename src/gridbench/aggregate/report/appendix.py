"""The report's end: failed and skipped cells, the graphs, the full data."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from gridbench import layout
from gridbench.aggregate import analysis
from gridbench.aggregate.analysis import Measure
from gridbench.aggregate.records import missing
from gridbench.aggregate.report.markdown import code, table
from gridbench.aggregate.text import DASH, pct, pm

Row = Mapping[Hashable, Any]  # a frame's row, as to_dict("records") gives it


@dataclass(frozen=True)
class UnmeasuredCell:
    """A failed or skipped cell as the report lists it."""

    config: str
    cell: str  # where in its kind's grid: "depth 4096", "code c=16", ...
    status: str
    reason: str
    log_path: str


@dataclass(frozen=True)
class KindOutcome:
    """One cell kind's scheduled and failed counts, and its unmeasured cells."""

    noun: str  # "depth cells"
    scheduled: int
    failed: int
    unmeasured: tuple[UnmeasuredCell, ...]


def _unmeasured(
    frame: pd.DataFrame, cell: Callable[[Row], str], status: str = "status"
) -> tuple[UnmeasuredCell, ...]:
    reason, log = (
        ("cached_reason", "cached_log_path") if status == "cached_status" else ("reason", "log_path")
    )
    return tuple(
        UnmeasuredCell(row["config"], cell(row), row[status], row[reason], row[log])
        for row in frame[frame[status] != "ok"].to_dict("records")
    )


def _outcome(
    noun: str, frame: pd.DataFrame, cell: Callable[[Row], str], status: str = "status"
) -> KindOutcome:
    failed = int((frame[status] == "failed").sum())
    return KindOutcome(
        noun, int((frame[status] != "skipped").sum()), failed, _unmeasured(frame, cell, status)
    )


def kind_outcomes(
    dataset: pd.DataFrame,
    natural: pd.DataFrame | None = None,
    quality: pd.DataFrame | None = None,
    load: pd.DataFrame | None = None,
    sessions: pd.DataFrame | None = None,
) -> list[KindOutcome]:
    """Each cell kind the study has, in the report's order; a frame that is None is a kind it lacks."""
    outcomes = [_outcome("depth cells", dataset, lambda r: f"depth {r['context_tokens']}")]
    cached = analysis.with_cached(dataset)
    if not cached.empty:
        outcomes.append(
            _outcome(
                "prefix-cache cells",
                cached,
                lambda r: f"depth {r['context_tokens']} (cached context)",
                status="cached_status",
            )
        )
    if natural is not None:
        outcomes.append(
            _outcome("natural-prompt cells", natural, lambda r: f"{r['prompt_class']} c={r['concurrency']}")
        )
    if quality is not None:
        outcomes.append(_outcome("quality cells", quality, lambda r: "quality"))
    if load is not None:
        outcomes.append(
            _outcome(
                "load cells",
                load,
                lambda r: f"{r['prompt_class']} {r['arrival']} at {r['rate_req_s']:g} req/s",
            )
        )
    if sessions is not None:
        outcomes.append(
            _outcome(
                "session cells",
                analysis.session_cells(sessions),
                lambda r: f"{r['prompt_class']} sessions={r['sessions']}",
            )
        )
    return outcomes


def failures_section(outcomes: Sequence[KindOutcome]) -> str:
    rows = [
        (code(c.config), c.cell, c.status, c.reason, code(c.log_path))
        for outcome in outcomes
        for c in outcome.unmeasured
    ]
    if not rows:
        return "None: every scheduled cell was measured."
    return table(("config", "cell", "status", "reason", "log"), rows)


def graphs_section(graphs: Sequence[str]) -> str:
    if not graphs:
        return "No graphs were drawn."
    blocks = []
    for link in graphs:
        name = link.rsplit("/", 1)[-1].removesuffix(".png")
        blocks.append(f"### {layout.GRAPH_TITLES.get(name, name)}\n\n![{name}]({link})")
    return "\n\n".join(blocks)


def full_data(dataset: pd.DataFrame) -> str:
    ok = analysis.measured(dataset)
    if ok.empty:
        return "No depth cell was measured."
    rows = []
    for row in ok.to_dict("records"):
        rows.append(
            (
                code(row["config"]),
                row["context_tokens"],
                pm(Measure.of(row["prefill_tps"], row["prefill_tps_std"])),
                pm(Measure.of(row["decode_tps"], row["decode_tps_std"])),
                pm(Measure.of(row["peak_tps"], row["peak_tps_std"])),
                pm(Measure.of(row["ttft_ms"], row["ttft_ms_std"])),
                pct(row["acceptance_rate"]) if not missing(row["acceptance_rate"]) else DASH,
            )
        )
    return table(
        ("config", "depth", "prefill tok/s", "decode tok/s", "peak tok/s", "TTFT (ms)", "acceptance"), rows
    )
