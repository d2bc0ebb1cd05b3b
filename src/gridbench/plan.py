"""The plan of a sweep: which cells exist, where their files go, which were skipped."""

from __future__ import annotations

from typing import Any

from gridbench import layout
from gridbench.grid import Grid
from gridbench.harness.prompts import resolve_prompts


def benchy_plan(grid: Grid) -> dict[str, Any]:
    cells, skipped = grid.cells()
    selected = {c.name: c.to_dict() for c in grid.selected()}
    return {
        "configs": selected,
        "cells": [
            {
                "config": cell.config,
                "depth": cell.depth,
                "raw": layout.RAW.format(config=cell.config, depth=cell.depth),
                "provenance": layout.PROVENANCE.format(config=cell.config, depth=cell.depth),
                "failure": layout.FAILURE.format(config=cell.config, depth=cell.depth),
                "log": layout.CELL_LOG.format(config=cell.config, depth=cell.depth),
            }
            for cell in cells
        ],
        "skipped": [{"config": s.config, "depth": s.depth, "reason": s.reason} for s in skipped],
        "cached_cells": [
            {
                "config": cell.config,
                "depth": cell.depth,
                "raw": layout.CACHED_RAW.format(config=cell.config, depth=cell.depth),
                "provenance": layout.CACHED_PROVENANCE.format(config=cell.config, depth=cell.depth),
                "failure": layout.CACHED_FAILURE.format(config=cell.config, depth=cell.depth),
                "log": layout.CACHED_LOG.format(config=cell.config, depth=cell.depth),
            }
            for cell in grid.prefix_cache_cells()
        ],
    }


def natural_plan(grid: Grid) -> dict[str, Any]:
    """The natural-prompt cells and their files; an unknown prompt class stops here."""
    if grid.natural is not None:
        resolve_prompts(grid.natural)
    cells = []
    for cell in grid.natural_cells():
        names = {"config": cell.config, "prompt_class": cell.prompt_class, "concurrency": cell.concurrency}
        cells.append(
            {
                **names,
                "raw": layout.NATURAL.format(**names),
                "provenance": layout.NATURAL_PROVENANCE.format(**names),
                "failure": layout.NATURAL_FAILURE.format(**names),
                "log": layout.NATURAL_LOG.format(**names),
            }
        )
    return {"configs": {c.name: c.to_dict() for c in grid.selected()}, "cells": cells}
