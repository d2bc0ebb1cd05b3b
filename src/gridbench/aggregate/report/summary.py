"""The report's opening: the verdict and the checks."""

from __future__ import annotations

import pandas as pd

from gridbench.aggregate.checks import run_checks
from gridbench.aggregate.report.k_sweep import k_sweep_verdict_lines
from gridbench.aggregate.report.phenomena import judged, tally_line
from gridbench.aggregate.text import and_list
from gridbench.aggregate.verdict import load_findings, verdict_lines
from gridbench.aggregate.weights_origin import MECHANISM_CHECK, RANDOM_WEIGHTS_SHOW, random_weight_configs
from gridbench.config.grid import Grid


def _split(frame: pd.DataFrame, configs: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The frame's rows of other configs, and those of ``configs``."""
    chosen = frame["config"].isin(configs)
    return frame[~chosen], frame[chosen]


def weighed_verdict_lines(grid: Grid, dataset: pd.DataFrame, natural: pd.DataFrame | None) -> list[str]:
    """The verdict's findings, those on real weights first; a finding that rests on random
    weights follows, labelled as the mechanism check it is."""
    random = random_weight_configs(grid)
    if not random or not dataset["config"].isin(random).any():
        return verdict_lines(dataset, natural, grid.study)
    real_depth, random_depth = _split(dataset, random)
    real_natural, random_natural = _split(natural, random) if natural is not None else (None, None)
    lines = []
    what = RANDOM_WEIGHTS_SHOW
    if real_depth.empty:
        lines.append(
            f"Every checkpoint measured here holds random weights: the lines below show that {what}."
        )
    else:
        lines += verdict_lines(real_depth, real_natural, grid.study)
        lines.append(f"{and_list(random)} serve random weights: the mechanism checks below show that {what}.")
    mechanism = verdict_lines(random_depth, random_natural, grid.study)
    return lines + [f"{MECHANISM_CHECK}: {line}" for line in mechanism]


def load_verdict_lines(grid: Grid, load: pd.DataFrame) -> list[str]:
    """Which config serves the most load under the SLO; on random weights, labelled as the
    mechanism check it is."""
    real, random = _split(load, random_weight_configs(grid))
    return load_findings(real) + [f"{MECHANISM_CHECK}: {line}" for line in load_findings(random)]


def verdict(
    grid: Grid,
    dataset: pd.DataFrame,
    natural: pd.DataFrame | None,
    quality: pd.DataFrame | None = None,
    load: pd.DataFrame | None = None,
) -> str:
    lines = weighed_verdict_lines(grid, dataset, natural)
    if load is not None:
        lines += load_verdict_lines(grid, load)
    lines += k_sweep_verdict_lines(grid, dataset, natural)
    tally = tally_line(judged(grid, dataset, natural))
    if tally:
        lines.insert(0, tally)
    # a caveat belongs next to the conclusions it qualifies, not only further down
    checks = run_checks(dataset, natural, grid.study, quality)
    warned = [check.title for check in checks if check.triggered]
    if warned:
        lines.append(
            f"Read these with the [Checks](#checks): {len(warned)} of {len(checks)} "
            f"{'warns' if len(warned) == 1 else 'warn'} "
            f"({'; '.join(warned)})."
        )
    return "\n".join(f"- {line}" for line in lines)


def checks_section(
    grid: Grid, dataset: pd.DataFrame, natural: pd.DataFrame | None, quality: pd.DataFrame | None = None
) -> str:
    lines = [f"- {check.line}" for check in run_checks(dataset, natural, grid.study, quality)]
    return (
        "What an expert would question before trusting these numbers; a warning names the cells "
        "and, where known, what typically causes it.\n\n" + "\n".join(lines)
    )
