"""The report's opening: the verdict and the checks."""

from __future__ import annotations

import pandas as pd

from gridbench.aggregate.checks import run_checks
from gridbench.aggregate.verdict import verdict_lines
from gridbench.grid import Grid


def verdict(grid: Grid, dataset: pd.DataFrame, natural: pd.DataFrame | None) -> str:
    lines = verdict_lines(dataset, natural, grid.study)
    # a caveat belongs next to the conclusions it qualifies, not only further down
    checks = run_checks(dataset, natural, grid.study)
    warned = [check.title for check in checks if check.triggered]
    if warned:
        lines.append(
            f"Read these with the [Checks](#checks): {len(warned)} of {len(checks)} "
            f"{'warns' if len(warned) == 1 else 'warn'} "
            f"({'; '.join(warned)})."
        )
    return "\n".join(f"- {line}" for line in lines)


def checks_section(grid: Grid, dataset: pd.DataFrame, natural: pd.DataFrame | None) -> str:
    lines = [f"- {check.line}" for check in run_checks(dataset, natural, grid.study)]
    return (
        "What an expert would question before trusting these numbers; a warning names the cells "
        "and, where known, what typically causes it.\n\n" + "\n".join(lines)
    )
