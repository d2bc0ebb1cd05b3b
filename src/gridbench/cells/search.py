"""The capacity search: after a config's listed rates, load cells at the rate bisecting the
highest one meeting the SLO and the lowest one missing it, until the two are within the
tolerance or the probes run out. Where every rate measured meets the SLO it climbs (the
highest times the growth factor), where none does it descends, until a bracket exists.

The next rate is a pure function of the outcomes so far (``next_rate``), so a search that
reads the cells it already measured takes the same steps again: an interrupted search
resumes where it stopped. ``probe_outcome`` is the edge: a cell's raw file read when
present, else measured first; a cell that failed (a failure record, no raw file) misses.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gridbench.harness.arrivals import SearchSettings, Slo
from gridbench.harness.goodput import slo_outcome
from gridbench.harness.load import LoadResult
from gridbench.util import codec

# a probed rate keeps this many significant digits, so its cell's file name stays short
_DIGITS = 3


@dataclass(frozen=True)
class Bracket:
    """The highest rate meeting the SLO below the lowest one missing it (None: none)."""

    passing_req_s: float | None
    failing_req_s: float | None


def bracket(outcomes: Mapping[float, bool]) -> Bracket:
    """As the load dataset's capacity: a rate passing above a failing one is noise."""
    failing = min((rate for rate, met in outcomes.items() if not met), default=None)
    passing = max(
        (rate for rate, met in outcomes.items() if met and (failing is None or rate < failing)), default=None
    )
    return Bracket(passing, failing)


def next_rate(outcomes: Mapping[float, bool], settings: SearchSettings) -> float | None:
    """The midpoint of the bracket; without a failing rate the highest passing one times
    ``settings.growth``, without a passing one the lowest failing one divided by it; None once
    the ends are within the tolerance of the passing rate (or the rate was measured already)."""
    ends = bracket(outcomes)
    low, high = ends.passing_req_s, ends.failing_req_s
    if low is not None and high is not None:
        if high - low <= settings.tolerance * low:
            return None
        candidate = (low + high) / 2
    elif low is not None:
        candidate = low * settings.growth
    elif high is not None:
        candidate = high / settings.growth
    else:
        return None
    rate = float(f"{candidate:.{_DIGITS}g}")
    return None if rate in outcomes else rate


@dataclass(frozen=True)
class Search:
    """What a search measured (rate -> met the SLO, in probe order) and where it stopped."""

    outcomes: dict[float, bool]
    probes: int  # rates added to the listed ones
    bracket: Bracket
    converged: bool  # the bracket is within the tolerance


def search_capacity(
    rates: Sequence[float], settings: SearchSettings, outcome: Callable[[float], bool]
) -> Search:
    """The listed rates, ascending, then at most ``settings.max_probes`` added ones."""
    outcomes = {rate: outcome(rate) for rate in sorted(rates)}
    probes = 0
    while probes < settings.max_probes and (rate := next_rate(outcomes, settings)) is not None:
        outcomes[rate] = outcome(rate)
        probes += 1
    ends = bracket(outcomes)
    low, high = ends.passing_req_s, ends.failing_req_s
    converged = low is not None and high is not None and high - low <= settings.tolerance * low
    return Search(outcomes, probes, ends, converged)


def read_result(raw: Path) -> LoadResult:
    return codec.from_json(LoadResult, json.loads(raw.read_text()))


def probe_outcome(raw: Path, slo: Slo, measure: Callable[[], object]) -> bool:
    """Whether the cell whose raw file is ``raw`` met ``slo``: read when present, else
    measured first (``measure`` writes it, or a failure record: then it missed)."""
    if not raw.is_file():
        measure()
    if not raw.is_file():
        return False
    return slo_outcome(read_result(raw).requests, slo).slo_met
