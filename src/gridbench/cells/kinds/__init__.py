"""The cell kinds a sweep runs, one module each, registered here in each config's run order:
its llama-benchy depths, its natural-prompt matrix, its greedy quality cell, its open-loop
load cells, then its prefix-cache pass (whose engine has the prefix cache on, so it replaces the config's cold
engine once, near the end), then its multi-turn session cells (on an engine with the prefix cache
on too: the pass's, where the engine kind needs no more flags to count cached tokens).

Adding a kind is one module with a ``CellKind`` subclass and its planned and running cell
records, a line below, and one rule in workflow/rules/ whose outputs are its patterns.
"""

from __future__ import annotations

import re

from gridbench.cells.kinds.base import Cell, CellKind, PlannedCell
from gridbench.cells.kinds.benchy import BENCHY, CACHED
from gridbench.cells.kinds.load import LOAD
from gridbench.cells.kinds.natural import NATURAL
from gridbench.cells.kinds.quality import QUALITY
from gridbench.cells.kinds.session import SESSION
from gridbench.config.grid import Grid
from gridbench.layout import telemetry_series

CELL_KINDS: dict[str, CellKind[PlannedCell]] = {
    kind.name: kind for kind in (BENCHY, NATURAL, QUALITY, LOAD, CACHED, SESSION)
}


def cell_kind(name: str) -> CellKind[PlannedCell]:
    """The kind of that name; the rules and the plan name only registered kinds."""
    return CELL_KINDS[name]


def wildcard_patterns(grid: Grid) -> dict[str, str]:
    """Every kind's wildcards, as the rules constrain them: a name two kinds share
    (prompt_class) matches either kind's values, its files' folders telling the kinds apart."""
    alternatives: dict[str, list[str]] = {}
    for kind in CELL_KINDS.values():
        for name, pattern in kind.wildcard_patterns(grid).items():
            alternatives.setdefault(name, []).append(pattern)
    return {name: "|".join(f"(?:{p})" for p in patterns) for name, patterns in alternatives.items()}


def result_folders() -> list[str]:
    """The folders the kinds' results and provenance records go under ("results/raw")."""
    return sorted({kind.patterns.raw.partition("{")[0].rstrip("/") for kind in CELL_KINDS.values()})


def cell_file_pattern() -> re.Pattern[str]:
    """What the kinds' cells write as results and provenance records: a relative path that
    does not match it is no cell's."""
    patterns = [
        p
        for kind in CELL_KINDS.values()
        for p in (kind.patterns.raw, kind.patterns.provenance, telemetry_series(kind.patterns.provenance))
    ]
    # every {wildcard} stands for one path segment
    return re.compile("|".join("[^/]+".join(map(re.escape, re.split(r"\{\w+\}", p))) for p in patterns))


__all__ = [
    "CELL_KINDS",
    "Cell",
    "CellKind",
    "PlannedCell",
    "cell_file_pattern",
    "cell_kind",
    "result_folders",
    "wildcard_patterns",
]
