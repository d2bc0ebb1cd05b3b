"""The plan of a sweep: which cells exist, where their files go, which were skipped."""

from __future__ import annotations

from dataclasses import dataclass

from gridbench.grid import Grid, ServingConfig, SkippedDepthCell
from gridbench.harness.prompts import resolve_prompts
from gridbench.layout import CellFiles, depth_cell_files, natural_cell_files


@dataclass(frozen=True)
class DepthCellPlan:
    """A llama-benchy cell (or its prefix-cache pass's) and its files."""

    config: str
    depth: int
    files: CellFiles

    @property
    def key(self) -> tuple[str, int]:
        return self.config, self.depth


@dataclass(frozen=True)
class NaturalCellPlan:
    """A natural-prompt cell and its files."""

    config: str
    prompt_class: str
    concurrency: int
    files: CellFiles

    @property
    def key(self) -> tuple[str, str, int]:
        return self.config, self.prompt_class, self.concurrency


@dataclass(frozen=True)
class DepthPlan:
    """The llama-benchy sweep: the selected configs in declared order, their cells in run
    order, the cells too long to run, and the prefix-cache pass's cells."""

    configs: dict[str, ServingConfig]
    cells: tuple[DepthCellPlan, ...]
    skipped: tuple[SkippedDepthCell, ...]
    cached_cells: tuple[DepthCellPlan, ...]


@dataclass(frozen=True)
class NaturalPlan:
    """The natural-prompt matrix: the selected configs in declared order and their cells."""

    configs: dict[str, ServingConfig]
    cells: tuple[NaturalCellPlan, ...]


def depth_plan(grid: Grid) -> DepthPlan:
    cells, skipped = grid.cells()
    return DepthPlan(
        configs={c.name: c for c in grid.selected()},
        cells=tuple(DepthCellPlan(c.config, c.depth, depth_cell_files(c.config, c.depth)) for c in cells),
        skipped=tuple(skipped),
        cached_cells=tuple(
            DepthCellPlan(c.config, c.depth, depth_cell_files(c.config, c.depth, prefix_cache=True))
            for c in grid.prefix_cache_cells()
        ),
    )


def natural_plan(grid: Grid) -> NaturalPlan:
    """The natural-prompt cells and their files; an unknown prompt class stops here."""
    if grid.natural is not None:
        resolve_prompts(grid.natural)
    return NaturalPlan(
        configs={c.name: c for c in grid.selected()},
        cells=tuple(
            NaturalCellPlan(
                c.config,
                c.prompt_class,
                c.concurrency,
                natural_cell_files(c.config, c.prompt_class, c.concurrency),
            )
            for c in grid.natural_cells()
        ),
    )
