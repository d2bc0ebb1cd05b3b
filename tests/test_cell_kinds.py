"""The cell-kind registry: each kind owns its coordinates, files, plan, context and progress
reader, and the plan, the run order, progress and the dataset's file check loop over the
registry, so a kind added there (one module) is planned, ordered, followed and recognised."""

from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import pytest

from conftest import REPO, load_yaml
from gridbench import layout
from gridbench.cells.kinds import CELL_KINDS, cell_file_pattern, result_folders
from gridbench.cells.kinds.base import Cell, CellKind, CellPatterns, KindPlan, PlannedCell, RequestProgress
from gridbench.cells.plan import run_order, sweep_plan
from gridbench.cells.progress import WorkdirReader, planned_cells
from gridbench.config.grid import Grid, ServingConfig
from gridbench.config.loading import load_grid


def mechanism_grid(**overrides: object) -> Grid:
    config = load_yaml(REPO / "config/mechanism.yaml")
    config.update(overrides)
    return load_grid(config, "mechanism.yaml")


def test_the_registry_holds_the_six_kinds_in_a_configs_run_order():
    assert list(CELL_KINDS) == ["benchy", "natural", "quality", "load", "benchy-cached", "session"]


@pytest.mark.parametrize("name", list(CELL_KINDS))
def test_a_kinds_file_patterns_name_only_the_config_and_its_coordinates(name):
    kind = CELL_KINDS[name]
    allowed = {"config", *kind.wildcard_names}
    p = kind.patterns
    for pattern in (p.raw, p.provenance, p.failure, p.log):
        fields = {f for _, f, _, _ in string.Formatter().parse(pattern) if f}
        assert fields == allowed, pattern
    cell_id_fields = {f for _, f, _, _ in string.Formatter().parse(p.cell_id) if f}
    assert cell_id_fields == set(kind.wildcard_names)


def test_no_two_kinds_share_a_file():
    files = [
        getattr(kind.patterns, part)
        for kind in CELL_KINDS.values()
        for part in ("raw", "provenance", "failure", "log")
    ]
    assert len(files) == len(set(files))


def test_each_kind_has_one_rule_whose_outputs_are_its_patterns():
    rules = "\n".join(p.read_text() for p in sorted((REPO / "workflow/rules").glob("*.smk")))
    for name in CELL_KINDS:
        for part in ("raw", "provenance", "log"):
            uses = re.findall(rf'CELL_KINDS\["{re.escape(name)}"\]\.patterns\.{part}\b', rules)
            assert len(uses) == 1, (name, part)


def test_the_run_order_keeps_a_configs_cells_together_kind_by_kind():
    grid = mechanism_grid()
    order = run_order(grid)
    first, second = list(grid.configs)[:2]
    depths, natural = grid.depths, grid.natural
    assert natural is not None
    benchy = [order.priority(first, "benchy", (str(d),)) for d in depths]
    levels = [
        order.priority(first, "natural", (cls, str(c)))
        for cls in natural.prompt_classes
        for c in natural.concurrency
    ]
    cached = [order.priority(first, "benchy-cached", (str(d),)) for d in depths if d > 0]
    in_order = benchy + levels + cached
    assert in_order == sorted(in_order, reverse=True) and len(set(in_order)) == len(in_order)
    # every cell of the first config before any of the second; the engine checks before all
    assert min(in_order) > order.priority(second, "benchy", (str(depths[0]),))
    assert order.engine_check_priority > max(in_order)


# --- a kind added to the registry --------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class EchoCellPlan(PlannedCell):
    words: int

    kind: ClassVar[str] = "echo"

    @property
    def key(self) -> tuple[str, int]:
        return self.config, self.words

    @property
    def cell_id(self) -> str:
        return f"echo_{self.words}"

    @property
    def label(self) -> str:
        return f"{self.config} echo {self.words}"

    @property
    def timing_keys(self) -> tuple[tuple[str | int, ...], ...]:
        return (("echo", self.words),)


class EchoKind(CellKind[EchoCellPlan]):
    """A kind as a new module would write it: two cells per config."""

    name: ClassVar[str] = "echo"
    context_name: ClassVar[str] = "echo"
    patterns: ClassVar[CellPatterns] = CellPatterns(
        raw="results/echo/{config}/w{words}.json",
        provenance="results/echo/{config}/w{words}.provenance.json",
        failure="results/failures/echo/{config}/w{words}.json",
        log="logs/cells/{config}/echo_{words}.log",
        cell_id="echo_{words}",
    )
    wildcard_names: ClassVar[tuple[str, ...]] = ("words",)
    progress_file: ClassVar[str] = "echo.progress"
    dataset: ClassVar[str] = "echo"

    def plan(self, grid: Grid, configs: Sequence[ServingConfig]) -> KindPlan[EchoCellPlan]:
        return KindPlan(
            tuple(
                EchoCellPlan(
                    config=c.name,
                    words=words,
                    files=self.patterns.files(config=c.name, words=words),
                    expected_requests=words,
                )
                for c in configs
                for words in (1, 2)
            )
        )

    def wildcard_patterns(self, grid: Grid) -> dict[str, str]:
        return {"words": r"\d+"}

    def coordinate_ranks(self, grid: Grid) -> dict[tuple[str, ...], int]:
        return {("1",): 0, ("2",): 1}

    def host_files(self, grid: Grid, config: str) -> list[str]:
        return []

    def context(self, grid: Grid, config: str, slots: list[str]) -> object:
        return {"config": config}

    def load(self, context: Path, wildcards: Mapping[str, str]) -> Cell:
        raise NotImplementedError("not run here")

    def requests(self, text: str, expected: int) -> RequestProgress:
        done = len(text.splitlines())
        return RequestProgress("echo", "measured", done, expected, 0, None, "none")


@pytest.fixture
def with_echo(monkeypatch):
    monkeypatch.setitem(CELL_KINDS, "echo", EchoKind())


def test_a_registered_kind_is_planned_ordered_followed_and_its_files_recognised(with_echo, tmp_path):
    grid = mechanism_grid(config="D_f16_n0")
    plan = sweep_plan(grid)
    echo = plan.kinds["echo"].cells
    assert [c.label for c in echo] == ["D_f16_n0 echo 1", "D_f16_n0 echo 2"]
    assert [c.label for c in planned_cells(grid)][-2:] == ["D_f16_n0 echo 1", "D_f16_n0 echo 2"]

    order = run_order(grid)
    last_cached = min(order.priority("D_f16_n0", "benchy-cached", (str(d),)) for d in grid.depths if d > 0)
    assert order.priority("D_f16_n0", "echo", ("1",)) < last_cached
    assert order.per_config > len(plan.cells)

    # a running echo cell: its scratch folder and its progress file, read by its kind
    started = datetime(2026, 12, 5, tzinfo=UTC)
    name = layout.SCRATCH_PREFIX.format(
        config="D_f16_n0", cell_id="echo_2", started_s=int(started.timestamp())
    )
    folder = tmp_path / layout.SCRATCH / f"{name}ab_3x9z0"
    folder.mkdir(parents=True)
    (folder / "echo.progress").write_text("one\n")
    observed = {o.cell.label: o for o in WorkdirReader(plan.cells, root=tmp_path).observations()}
    requests = observed["D_f16_n0 echo 2"].requests
    assert requests is not None and (requests.requests_done, requests.requests_expected) == (1, 2)

    assert "results/echo" in result_folders()
    assert cell_file_pattern().fullmatch("results/echo/D_f16_n0/w2.provenance.json")
    assert not cell_file_pattern().fullmatch("results/echo/D_f16_n0/notes.txt")
