"""The plan of a sweep: which cells exist, in which order, where their files go, and which
were skipped. The one place that enumerates a grid's cells: the rules, the CLI, the
progress follower and the dataset builders all take their cells from here."""

from __future__ import annotations

from dataclasses import dataclass

from gridbench.grid import Grid, ServingConfig
from gridbench.harness.prompts import resolve_prompts
from gridbench.layout import CellFiles, depth_cell_files, natural_cell_files


@dataclass(frozen=True)
class DepthCellPlan:
    """A llama-benchy cell (or its prefix-cache pass's) and its files (cell.DepthCell runs one)."""

    config: str
    depth: int
    files: CellFiles

    @property
    def key(self) -> tuple[str, int]:
        return self.config, self.depth


@dataclass(frozen=True)
class SkippedDepthCell:
    """A llama-benchy cell the grid declares but its config cannot run, and why."""

    config: str
    depth: int
    reason: str


@dataclass(frozen=True)
class NaturalCellPlan:
    """A natural-prompt cell and its files (cell.NaturalCell runs one)."""

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


def _too_long(grid: Grid, config: ServingConfig, depth: int) -> str | None:
    """Why a depth's prompt does not fit the config's context, or None when it does."""
    needed = depth + grid.benchy.pp + grid.benchy.tg
    if needed <= config.serving.max_model_len:
        return None
    return (
        f"depth {depth} + pp {grid.benchy.pp} + tg {grid.benchy.tg} = {needed} "
        f"exceeds max_model_len {config.serving.max_model_len}"
    )


def depth_plan(grid: Grid) -> DepthPlan:
    """The llama-benchy cells in run order (config-major, then depth), those too long to run,
    and the prefix-cache pass: one cell per scheduled cell with context of a config in
    grid.prefix_cache_pass (at depth 0 there is no context to cache)."""
    selected = grid.selected()
    cells: list[DepthCellPlan] = []
    skipped: list[SkippedDepthCell] = []
    for config in selected:
        for depth in grid.depths:
            reason = _too_long(grid, config, depth)
            if reason is None:
                cells.append(DepthCellPlan(config.name, depth, depth_cell_files(config.name, depth)))
            else:
                skipped.append(SkippedDepthCell(config.name, depth, reason))
    return DepthPlan(
        configs={c.name: c for c in selected},
        cells=tuple(cells),
        skipped=tuple(skipped),
        cached_cells=tuple(
            DepthCellPlan(c.config, c.depth, depth_cell_files(c.config, c.depth, prefix_cache=True))
            for c in cells
            if c.config in grid.prefix_cache_pass and c.depth > 0
        ),
    )


def natural_plan(grid: Grid) -> NaturalPlan:
    """The natural-prompt cells in run order (config, then prompt class, then concurrency) and
    their files; an unknown prompt class stops here."""
    natural = grid.natural
    if natural is not None:
        resolve_prompts(natural)
    selected = grid.selected()
    return NaturalPlan(
        configs={c.name: c for c in selected},
        cells=()
        if natural is None
        else tuple(
            NaturalCellPlan(
                config.name,
                prompt_class,
                concurrency,
                natural_cell_files(config.name, prompt_class, concurrency),
            )
            for config in selected
            for prompt_class in natural.prompt_classes
            for concurrency in natural.concurrency
        ),
    )
