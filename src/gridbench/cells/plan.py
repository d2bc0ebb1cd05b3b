"""The plan of a sweep: which cells exist, in which order, where their files go, and which
were skipped. The one place that enumerates a grid's cells, by asking each registered kind:
the rules, the CLI, the progress follower and the dataset builders all take their cells from here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from gridbench.cells.kinds import CELL_KINDS, PlannedCell
from gridbench.cells.kinds.base import KindPlan, Skipped
from gridbench.cells.kinds.benchy import BENCHY, CACHED, DepthCellPlan
from gridbench.cells.kinds.load import LOAD, LoadCellPlan
from gridbench.cells.kinds.natural import NATURAL, NaturalCellPlan
from gridbench.cells.kinds.quality import QUALITY, QualityCellPlan
from gridbench.cells.kinds.session import SESSION, SessionCellPlan
from gridbench.config.grid import Grid, ServingConfig
from gridbench.errors import ConfigError
from gridbench.harness.arrivals import Slo
from gridbench.harness.prompts import QualitySettings

Section = TypeVar("Section")


@dataclass(frozen=True)
class SweepPlan:
    """The selected configs in declared order and each kind's cells of them."""

    configs: dict[str, ServingConfig]
    kinds: dict[str, KindPlan[PlannedCell]]  # in the registry's order

    @property
    def cells(self) -> list[PlannedCell]:
        """Every cell to run, kind by kind."""
        return [cell for plan in self.kinds.values() for cell in plan.cells]


def sweep_plan(grid: Grid) -> SweepPlan:
    selected = grid.selected()
    return SweepPlan(
        configs={c.name: c for c in selected},
        kinds={name: kind.plan(grid, selected) for name, kind in CELL_KINDS.items()},
    )


@dataclass(frozen=True)
class DepthPlan:
    """What the depth dataset reads: the llama-benchy cells in run order (config-major, then
    depth), the cells too long to run, and the prefix-cache pass's cells."""

    configs: dict[str, ServingConfig]
    cells: tuple[DepthCellPlan, ...]
    skipped: tuple[Skipped[DepthCellPlan], ...]
    cached_cells: tuple[DepthCellPlan, ...]
    gpu_hour_usd: float | None = None  # study.hardware's price: the cost per token


@dataclass(frozen=True)
class NaturalPlan:
    """What the natural dataset reads: the natural-prompt matrix's cells in run order."""

    configs: dict[str, ServingConfig]
    cells: tuple[NaturalCellPlan, ...]
    gpu_hour_usd: float | None = None


def depth_plan(grid: Grid) -> DepthPlan:
    selected = grid.selected()
    cold = BENCHY.plan(grid, selected)
    return DepthPlan(
        configs={c.name: c for c in selected},
        cells=cold.cells,
        skipped=cold.skipped,
        cached_cells=CACHED.plan(grid, selected).cells,
        gpu_hour_usd=grid.study.hardware.gpu_hour_usd,
    )


def _section(grid: Grid, name: str, section: Section | None) -> Section:
    """The grid's section of that name, which a dataset of its cells needs."""
    if section is None:
        raise ConfigError(
            f"{grid.source}: the grid has no {name} section, so no {name} dataset",
            hint=f"add a {name}: section to the config (docs/config-reference.md#{name})",
        )
    return section


def natural_plan(grid: Grid) -> NaturalPlan:
    selected = grid.selected()
    return NaturalPlan(
        configs={c.name: c for c in selected},
        cells=NATURAL.plan(grid, selected).cells,
        gpu_hour_usd=grid.study.hardware.gpu_hour_usd,
    )


@dataclass(frozen=True)
class QualityPlan:
    """What the quality dataset reads: the selected configs, their quality cells in run
    order, the quality settings (the declared reference) and the study's declared baselines."""

    configs: dict[str, ServingConfig]
    cells: tuple[QualityCellPlan, ...]
    settings: QualitySettings
    baselines: Mapping[str, str]  # study.baseline: config -> its declared baseline
    gpu_hour_usd: float | None = None


def quality_plan(grid: Grid) -> QualityPlan:
    quality = _section(grid, "quality", grid.quality)
    selected = grid.selected()
    return QualityPlan(
        configs={c.name: c for c in selected},
        cells=QUALITY.plan(grid, selected).cells,
        settings=quality,
        baselines=grid.study.baseline,
        gpu_hour_usd=grid.study.hardware.gpu_hour_usd,
    )


@dataclass(frozen=True)
class LoadPlan:
    """What the load dataset reads: the load cells in run order, and the SLO they are judged by."""

    configs: dict[str, ServingConfig]
    cells: tuple[LoadCellPlan, ...]
    slo: Slo
    gpu_hour_usd: float | None = None


def load_plan(grid: Grid, *, searched: bool = False) -> LoadPlan:
    """The load cells the load section lists; with ``searched``, also those that
    ``gridbench load-search`` added where their raw files are (the dataset's view)."""
    load = _section(grid, "load", grid.load)
    selected = grid.selected()
    cells = LOAD.plan(grid, selected).cells
    if searched:
        cells += LOAD.searched(grid, selected)
    return LoadPlan(
        configs={c.name: c for c in selected},
        cells=cells,
        slo=load.slo,
        gpu_hour_usd=grid.study.hardware.gpu_hour_usd,
    )


@dataclass(frozen=True)
class SessionPlan:
    """What the sessions dataset reads: the session cells in run order, and their turns."""

    configs: dict[str, ServingConfig]
    cells: tuple[SessionCellPlan, ...]
    turns: int


def session_plan(grid: Grid) -> SessionPlan:
    sessions = _section(grid, "sessions", grid.sessions)
    selected = grid.selected()
    return SessionPlan(
        configs={c.name: c for c in selected},
        cells=SESSION.plan(grid, selected).cells,
        turns=sessions.conversation.turns,
    )


@dataclass(frozen=True)
class RunOrder:
    """The order Snakemake runs the ready cells in, as its priorities (higher first): configs
    in the config file's order, and within a config the kinds in the registry's order, each
    kind's coordinates in its run order. A config's cells then run back to back on one warm
    engine."""

    config_ranks: dict[str, int]
    kind_offsets: dict[str, int]  # where each kind's cells start within a config
    coordinate_ranks: dict[str, dict[tuple[str, ...], int]]  # by kind, its wildcards' values
    per_config: int  # more than a config's cells

    def priority(self, config: str, kind: str, coordinates: tuple[str, ...]) -> int:
        config_rank = len(self.config_ranks) - self.config_ranks[config]
        within = self.kind_offsets[kind] + self.coordinate_ranks[kind][coordinates]
        return self.per_config * config_rank - within

    @property
    def engine_check_priority(self) -> int:
        """Above every cell's: an engine's check runs as soon as its files are there. Left at
        the default it waits behind every ready cell of the other engines, so a sweep cut short
        (a GPU loan's end) never reached the later engines' cells at all."""
        return self.per_config * (len(self.config_ranks) + 1)


def run_order(grid: Grid) -> RunOrder:
    ranks = {name: kind.coordinate_ranks(grid) for name, kind in CELL_KINDS.items()}
    offsets, offset = {}, 0
    for name, of_kind in ranks.items():
        offsets[name] = offset
        offset += len(of_kind)
    return RunOrder(
        config_ranks={config.name: rank for rank, config in enumerate(grid.selected())},
        kind_offsets=offsets,
        coordinate_ranks=ranks,
        per_config=offset + 1,
    )
