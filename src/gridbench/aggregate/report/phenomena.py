"""The report's answer to "which of the seeds' speculation findings show here?"."""

from __future__ import annotations

import pandas as pd

from gridbench.aggregate import phenomena
from gridbench.aggregate.phenomena import Judgement
from gridbench.aggregate.report.markdown import code, table
from gridbench.aggregate.text import DASH, and_list
from gridbench.aggregate.weights_origin import RANDOM_WEIGHTS_SHOW, is_random
from gridbench.config.grid import Grid

SECTION = "The seeds' speculation phenomena"


def speculative_configs(grid: Grid, dataset: pd.DataFrame, natural: pd.DataFrame | None) -> list[str]:
    """Speculative configs with a measured row, in the grid's order."""
    present = set(dataset["config"]) | (set(natural["config"]) if natural is not None else set())
    return [n for n, c in grid.configs.items() if n in present and c.speculation.method != "none"]


def judged(grid: Grid, dataset: pd.DataFrame, natural: pd.DataFrame | None) -> list[Judgement]:
    """The phenomena for every speculative config not declared to serve random weights."""
    configs = [
        c
        for c in speculative_configs(grid, dataset, natural)
        if not is_random(grid.configs[c].checkpoint.origin)
    ]
    return phenomena.judge(configs, dataset, natural, grid.study)


def _cell(j: Judgement) -> str:
    if j.shown is None:
        return f"{DASH} ({j.evidence})"
    return f"{'shown' if j.shown else 'not shown'}: {j.evidence}"


def tally_line(judgements: list[Judgement]) -> str | None:
    """One verdict line: for how many configs each phenomenon shows, of those measuring it."""
    clauses = []
    for phenomenon in phenomena.PHENOMENA:
        mine = [j for j in judgements if j.phenomenon == phenomenon and j.shown is not None]
        if mine:
            shown = [j.config for j in mine if j.shown]
            clauses.append(
                f"{phenomenon} for {len(shown)} of {len(mine)}{f' ({and_list(shown)})' if shown else ''}"
            )
    if not clauses:
        return None
    link = f"[{SECTION}](#the-seeds-speculation-phenomena)"
    return f"The seeds' speculation findings, on these weights: {'; '.join(clauses)} (see {link})."


def phenomena_section(grid: Grid, dataset: pd.DataFrame, natural: pd.DataFrame | None) -> str:
    speculative = speculative_configs(grid, dataset, natural)
    if not speculative:
        return ""
    random = [c for c in speculative if is_random(grid.configs[c].checkpoint.origin)]
    judgements = judged(grid, dataset, natural)
    intro = (
        "Seed 000 found acceptance depending on the prompt class and decaying by draft position; "
        "seed 002 a speed-up that changes with context depth. Each is judged here from the "
        "tables below: shown when acceptance differs by "
        f"{phenomena.CLASS_SPREAD * 100:.0f} points or more between classes (at the lowest "
        f"concurrency measured on several), falls by {phenomena.POSITION_DECAY * 100:.0f} points "
        "or more from the first draft position to the last (pooled over the depth cells), or "
        f"the decode speed-up over the config without speculation varies by "
        f"{(phenomena.DEPTH_CHANGE - 1) * 100:.0f} % or more across depths."
    )
    parts = [f"## {SECTION}", intro]
    if judgements:
        by_config: dict[str, dict[str, Judgement]] = {}
        for j in judgements:
            by_config.setdefault(j.config, {})[j.phenomenon] = j
        rows = [
            (code(config), *(_cell(found[p]) for p in phenomena.PHENOMENA))
            for config, found in by_config.items()
        ]
        parts.append(table(("config", *phenomena.PHENOMENA), rows))
    if random:
        parts.append(
            f"Not judged: {and_list([code(c) for c in random])} serve random weights, which show that "
            f"{RANDOM_WEIGHTS_SHOW}."
        )
    return "\n\n".join(parts)
