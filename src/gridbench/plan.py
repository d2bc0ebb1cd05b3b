"""The plan of a sweep: which cells exist, where their files go, which were skipped."""

from __future__ import annotations

from typing import Any

from gridbench import layout
from gridbench.grid import Grid


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
    }
