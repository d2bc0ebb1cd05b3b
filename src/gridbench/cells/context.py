"""The context file a config's cells of one kind share, named by its content: a cell's
params (the path) change exactly when what it measures changes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from gridbench.cells.kinds import Cell, cell_kind
from gridbench.config.grid import Grid
from gridbench.util import codec
from gridbench.util.files import atomic_write_text

CONTEXT_DIR = Path(".gridbench/contexts")


def write_context(grid: Grid, config: str, slots: list[str], kind: str) -> Path:
    """The context file of the config's cells of ``kind`` (a registered kind's name), written
    once. Natural contexts carry the prompt strings themselves, so an edited prompt file reruns
    its cells."""
    of_kind = cell_kind(kind)
    text = json.dumps(
        codec.to_json(of_kind.context(grid, config, slots)), sort_keys=True, separators=(",", ":")
    )
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = CONTEXT_DIR / f"{config}-{of_kind.context_name}-{digest}.json"
    if not path.exists():
        atomic_write_text(path, text)
    return path


def cell_from_grid(grid: Grid, kind: str, config: str, slots: list[str], **wildcards: object) -> Cell:
    """A cell as its process will read it, its context file written (tests, tools)."""
    context = write_context(grid, config, slots, kind)
    return cell_kind(kind).load(context, {name: str(value) for name, value in wildcards.items()})
