"""The natural-prompt cells of a grid and where their files go.

Free of pandas and matplotlib: the workflow imports it while it builds the DAG.
"""

from __future__ import annotations

from typing import Any

from gridbench import layout
from gridbench.grid import Grid


def natural_plan(grid: Grid) -> dict[str, Any]:
    """The natural cells of the selected configs and where their files go (empty when the
    study declares no natural matrix)."""
    selected = {c.name: c.to_dict() for c in grid.selected()}
    if not grid.natural:
        return {"configs": selected, "cells": []}
    cells = []
    for config in selected:
        for prompt_class in grid.natural["prompt_classes"]:
            for concurrency in sorted(grid.natural["concurrency"]):
                names = {"config": config, "prompt_class": prompt_class, "concurrency": concurrency}
                cells.append(
                    {
                        **names,
                        "raw": layout.NATURAL.format(**names),
                        "provenance": layout.NATURAL_PROVENANCE.format(**names),
                        "failure": layout.NATURAL_FAILURE.format(**names),
                        "log": layout.NATURAL_LOG.format(**names),
                    }
                )
    return {"configs": selected, "cells": cells}
