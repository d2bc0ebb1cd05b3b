"""comparison.md, generated in full: a pure function of the dataset frames and the grid.

The same frames and grid give the same bytes (no clock, no host lookups): the report of a
rerun changes only where the data did.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from gridbench.aggregate.ledger import GpuLedger
from gridbench.aggregate.report.appendix import (
    KindOutcome,
    failures_section,
    full_data,
    graphs_section,
    kind_outcomes,
)
from gridbench.aggregate.report.depth import (
    acceptance_section,
    cached_section,
    engine_section,
    roofline_section,
    speedup_section,
    startup_section,
    summary_table,
)
from gridbench.aggregate.report.energy import energy_section, method_line
from gridbench.aggregate.report.k_sweep import k_sweep_section
from gridbench.aggregate.report.ledger import METHOD_LINE, ledger_section, ledger_verdict_line
from gridbench.aggregate.report.load import load_section
from gridbench.aggregate.report.natural import (
    capacity_section,
    natural_section,
    pareto_section,
    workload_class_section,
)
from gridbench.aggregate.report.phenomena import phenomena_section
from gridbench.aggregate.report.quality import quality_section
from gridbench.aggregate.report.sessions import sessions_section
from gridbench.aggregate.report.spec_log import cross_checks
from gridbench.aggregate.report.study import configs_table, environment, method
from gridbench.aggregate.report.summary import checks_section, verdict
from gridbench.aggregate.spec_log import EngineRun
from gridbench.config.grid import Grid


def render_report(
    grid: Grid,
    dataset: pd.DataFrame,
    natural: pd.DataFrame | None = None,
    graphs: Sequence[str] = (),
    quality: pd.DataFrame | None = None,
    ledger: GpuLedger | None = None,
    load: pd.DataFrame | None = None,
    sessions: pd.DataFrame | None = None,
    engine_runs: Sequence[EngineRun] = (),
) -> str:
    """The whole comparison.md. ``graphs`` are links to the PNG files, relative to the report;
    ``quality`` (the quality dataset, with a quality section) adds its check and section;
    ``ledger`` (the engines' GPU time, aggregate.ledger) adds a verdict line and its section;
    ``load`` (the load dataset, with a load section) adds its verdict lines and section;
    ``sessions`` (the sessions dataset, with a sessions section) adds its section;
    ``engine_runs`` (the engines' logs, aggregate.spec_log) add the acceptance's cross-check."""
    study = grid.study
    # plain object columns: the many small selections below run ~3x faster than on Arrow
    # strings and nullable dtypes, and every value renders the same
    dataset = dataset.astype(object)
    natural = natural.astype(object) if natural is not None and not natural.empty else None
    outcomes = kind_outcomes(dataset, natural, quality, load, sessions)
    sections = [
        f"# {study.title or 'gridbench comparison'}",
        partial_banner(outcomes),
        "## Verdict\n\n" + _with_ledger_line(verdict(grid, dataset, natural, quality, load), ledger),
        "## Checks\n\n" + checks_section(grid, dataset, natural, quality),
        phenomena_section(grid, dataset, natural),
        "## Method\n\n" + _method(grid, dataset, natural, ledger),
        "## Environment and provenance\n\n" + environment(grid, dataset, natural),
        "## Configs\n\n" + configs_table(grid, dataset),
        "## Summary: decode tok/s and TTFT by context depth\n\n" + summary_table(dataset),
        "## Speedup over baseline\n\n" + speedup_section(dataset, study),
        "## Engine comparison\n\n" + engine_section(dataset),
        "## Engine start-up\n\n" + startup_section(dataset, natural, quality, load, sessions),
        "## GPU time\n\n" + ledger_section(ledger) if ledger is not None else "",
        "## Energy and cost\n\n" + energy_section(dataset, natural, study),
        "## Roofline realisation\n\n" + roofline_section(dataset, study),
        "## Speculative decoding acceptance\n\n" + acceptance_section(dataset),
        cross_checks(engine_runs, dataset, natural),
    ]
    if grid.prefix_cache_pass:
        sections.append("## Prefix cache: TTFT cold vs cached context\n\n" + cached_section(dataset))
    if grid.natural:
        sections += [
            "## Natural prompts\n\n" + natural_section(natural),
            "## Acceptance by prompt class\n\n" + workload_class_section(natural),
            "## Capacity under latency targets\n\n" + capacity_section(natural, study),
            "## Pareto frontier: throughput per GPU against per-user speed\n\n"
            + pareto_section(natural, study),
        ]
    sections.append(k_sweep_section(grid, dataset, natural))
    sections += _optional_sections(dataset, quality, load, sessions)
    sections += [
        "## Failed and skipped cells\n\n" + failures_section(outcomes),
        "## Graphs\n\n" + graphs_section(graphs),
        "## Full data\n\n" + full_data(dataset),
    ]
    return "\n\n".join(s for s in sections if s) + "\n"


def _optional_sections(
    dataset: pd.DataFrame,
    quality: pd.DataFrame | None,
    load: pd.DataFrame | None,
    sessions: pd.DataFrame | None,
) -> list[str]:
    """The sections of the datasets a study has only with their config sections."""
    sections = []
    if quality is not None:
        sections.append(
            "## Quality: greedy agreement with the reference, beside speed\n\n"
            + quality_section(quality, dataset)
        )
    if load is not None:
        sections.append("## Capacity under the SLO (open-loop load)\n\n" + load_section(load))
    if sessions is not None:
        sections.append(
            "## Multi-turn sessions: TTFT and the prefix cache by turn\n\n" + sessions_section(sessions)
        )
    return sections


def _method(grid: Grid, dataset: pd.DataFrame, natural: pd.DataFrame | None, ledger: GpuLedger | None) -> str:
    """The method, with the GPU time's line where there is a ledger and energy's where a cell has any."""
    energy = method_line(dataset, natural, grid.study)
    lines = [method(grid, dataset, natural), METHOD_LINE if ledger is not None else None, energy]
    return "\n".join(line for line in lines if line)


def _with_ledger_line(verdict_text: str, ledger: GpuLedger | None) -> str:
    line = ledger_verdict_line(ledger) if ledger is not None else None
    return verdict_text + f"\n- {line}" if line else verdict_text


def is_partial(outcomes: Sequence[KindOutcome]) -> bool:
    return any(outcome.failed for outcome in outcomes)


def partial_banner(outcomes: Sequence[KindOutcome]) -> str:
    if not is_partial(outcomes):
        return ""
    parts = [f"{o.failed} of {o.scheduled} {o.noun}" for o in outcomes]
    return (
        f"> **Partial results.** {' and '.join(parts)} failed. They are listed with their "
        "reasons under [Failed and skipped cells](#failed-and-skipped-cells); no value, graph "
        "or statement below comes from them."
    )
