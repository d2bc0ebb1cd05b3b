"""What every cell kind provides: one module per kind (kinds/<kind>.py), registered in
kinds/__init__.py. A kind owns its coordinates and file patterns, its plan, its context file,
how its cell measures on a leased engine, and how its load generator's progress file reads.
The plan, the cell runner, progress, the readers and the rules loop over the registry."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar

import cattrs

from gridbench.config.grid import Grid, ServingConfig
from gridbench.layout import CellFiles
from gridbench.util import codec

if TYPE_CHECKING:  # annotations only: planning and progress need no engine
    from gridbench.cells.records import CellCoordinates, Measured
    from gridbench.engines.manager import EngineLease

Line = TypeVar("Line")


@dataclass(frozen=True)
class CellPatterns:
    """A kind's file patterns over ``{config}`` and its coordinates' names: the rules name
    their outputs with them, the plan fills them in."""

    raw: str
    provenance: str
    failure: str
    log: str
    # names a running cell's scratch folder (layout.SCRATCH_PREFIX), unique within its config
    cell_id: str

    def files(self, **names: object) -> CellFiles:
        return CellFiles(*(p.format(**names) for p in (self.raw, self.provenance, self.failure, self.log)))


@dataclass(frozen=True, kw_only=True)
class PlannedCell(ABC):
    """One cell of the plan: its config, its coordinates (a kind's fields) and its files."""

    config: str
    files: CellFiles
    expected_requests: int  # the measured requests its load generator sends

    kind: ClassVar[str]  # the registry's name of its kind

    @property
    @abstractmethod
    def key(self) -> tuple[Hashable, ...]:
        """The config and the coordinates: which cell it is within the plan."""

    @property
    @abstractmethod
    def cell_id(self) -> str: ...

    @property
    @abstractmethod
    def label(self) -> str:
        """How progress names it: "V_fp8 depth 32768", "V_fp8 code c=4"."""

    @property
    @abstractmethod
    def timing_keys(self) -> tuple[tuple[Hashable, ...], ...]:
        """Which finished cells' times predict this one's, most specific first."""

    @property
    def scratch_name(self) -> str:
        """Its scratch folder's name without the start time and mkdtemp's tail."""
        return f"{self.config}-{self.cell_id}"


# covariant: a kind of DepthCellPlan cells is a kind of PlannedCell cells
Planned = TypeVar("Planned", bound=PlannedCell, covariant=True)


@dataclass(frozen=True)
class Skipped(Generic[Planned]):
    """A cell the grid declares but its config cannot run, and why."""

    cell: Planned
    reason: str


@dataclass(frozen=True)
class KindPlan(Generic[Planned]):
    """A kind's cells of the selected configs in run order, and those it skips."""

    cells: tuple[Planned, ...]
    skipped: tuple[Skipped[Planned], ...] = ()


@dataclass(frozen=True)
class RequestProgress:
    """A running cell's load generator: requests ended of those it sends, and its speed so far."""

    load_generator: str  # "llama-benchy" or "natural"
    phase: str  # "measured", or "warm-up" (natural's uncounted requests)
    requests_done: int
    requests_expected: int
    requests_failed: int
    tok_s: float | None  # None before the first request ended
    tok_s_meaning: str  # "decode per request" (llama-benchy), "output, all requests" (natural)


@dataclass(frozen=True)
class Cell(ABC):
    """One cell of a sweep, as its process runs it: its config (from the context file the
    config's cells share), the engine slots it may use, and its own coordinates."""

    config: ServingConfig  # as the context file holds it
    slots: list[str]

    kind: ClassVar[str]  # the failure record's kind: "benchy" or "natural"

    @property
    def serving_config(self) -> ServingConfig:
        """The config as the cell's engine serves it."""
        return self.config

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def needs_fresh_engine(self) -> bool:
        """Whether it measures on an engine that has served nothing before it (a warm one is
        replaced)."""
        return False

    @property
    @abstractmethod
    def cell_id(self) -> str: ...

    @property
    @abstractmethod
    def what(self) -> str:
        """How messages name the cell."""

    @abstractmethod
    def files(self) -> CellFiles: ...

    def failure_path(self) -> Path:
        return Path(self.files().failure)

    def log_path(self) -> Path:
        return Path(self.files().log)

    @abstractmethod
    def coordinates(self) -> CellCoordinates: ...

    @abstractmethod
    def measure(self, engine: EngineLease, scratch: Path) -> Measured: ...


class CellKind(ABC, Generic[Planned]):
    """A kind of cell. Subclasses set the class attributes and implement the methods."""

    name: ClassVar[str]  # the registry's key
    context_name: ClassVar[str]  # names its context files; kinds that share one share it
    patterns: ClassVar[CellPatterns]
    wildcard_names: ClassVar[tuple[str, ...]]  # its coordinates, as the rules' wildcards
    progress_file: ClassVar[str]  # its load generator's, in the cell's scratch folder
    dataset: ClassVar[str]  # which dataset its results are rows of: "depth" or "natural"

    @abstractmethod
    def plan(self, grid: Grid, configs: Sequence[ServingConfig]) -> KindPlan[Planned]:
        """Its cells of these configs (the selected ones, in declared order) in run order."""

    @abstractmethod
    def wildcard_patterns(self, grid: Grid) -> dict[str, str]:
        """The regular expression each of its wildcards matches."""

    @abstractmethod
    def coordinate_ranks(self, grid: Grid) -> dict[tuple[str, ...], int]:
        """Each of a config's coordinates (its wildcards' values) by run order."""

    @abstractmethod
    def host_files(self, grid: Grid, config: str) -> list[str]:
        """What a cell of the config reads on the host, beside its engine's files."""

    @abstractmethod
    def context(self, grid: Grid, config: str, slots: list[str]) -> object:
        """What the config's cells of this kind share: their context file's record."""

    @abstractmethod
    def load(self, context: Path, wildcards: Mapping[str, str]) -> Cell:
        """The cell a process runs: its config's context file and its coordinates."""

    @abstractmethod
    def requests(self, text: str, expected: int) -> RequestProgress:
        """Its load generator's progress file so far (a line still being written is skipped)."""


def json_lines(cls: type[Line], text: str) -> list[Line]:
    """The ``cls`` records of a JSON-lines text; a line of another shape is skipped, as is
    the line its writer is still appending."""
    records = []
    for line in text.splitlines():
        try:
            document = json.loads(line)
            if isinstance(document, dict):
                records.append(codec.from_json(cls, document))
        except (json.JSONDecodeError, cattrs.BaseValidationError):
            continue
    return records
