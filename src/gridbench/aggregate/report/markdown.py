"""Markdown pieces the report's sections are built from."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import pandas as pd

from gridbench.aggregate.text import DASH


def cell_text(value: object) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return DASH
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell_text(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def code(text: object) -> str:
    return DASH if text is None or text is pd.NA else f"`{text}`"


def depth_list(depths: Iterable[int]) -> str:
    return ", ".join(str(d) for d in depths)
