"""How numbers read in the report: one precision rule for every value, so the verdict, the
checks and the tables quote a measurement the same way."""

from __future__ import annotations

from gridbench.aggregate.analysis import Measure
from gridbench.aggregate.records import Scalar, missing

DASH = "—"


def decimals(value: float) -> int:
    magnitude = abs(value)
    return 0 if magnitude >= 100 else 1 if magnitude >= 10 else 2


def num(value: Scalar, places: int | None = None) -> str:
    if value is None or missing(value):
        return DASH
    number = float(value)
    return f"{number:.{decimals(number) if places is None else places}f}"


def pm(measure: Measure | None) -> str:
    """mean ± std with the mean's precision."""
    if measure is None:
        return DASH
    places = decimals(measure.mean)
    return f"{measure.mean:.{places}f} ± {measure.std:.{places}f}"


def ratio_text(measure: Measure) -> str:
    return f"{measure.mean:.2f} ± {measure.std:.2f}×"


def pct(value: float) -> str:
    return f"{value * 100:.0f} %"


def span(first: int, last: int) -> str:
    """A depth or concurrency range: "0–65536", or one value."""
    return str(first) if first == last else f"{first}–{last}"


def and_list(items: list[str]) -> str:
    """a, b and c."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
