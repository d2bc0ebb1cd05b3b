"""Open-loop load: the ``load:`` section's settings and each cell's arrival schedule. Pure.

A cell's schedule is a function of the section's seed, its arrival process and its rate
alone: every config and prompt class at that process and rate is sent the same arrival
times, and a cell measured again is sent them again.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import PurePath

from gridbench.util import codec
from gridbench.util.files import JsonObject

POISSON, GAMMA, TRACE = "poisson", "gamma", "trace"
AUTO_PROCESSES = "auto"  # natural.processes' and load.processes' default (the schema's)


@dataclass(frozen=True)
class Arrival:
    """An arrival process: Poisson, gamma gaps of shape ``shape`` (the same mean gap), or the
    replay of the trace file ``trace`` (harness/trace.py)."""

    process: str
    shape: float | None = None
    # left out of a record when None: the documents of Poisson and gamma cells stay as they were
    trace: str | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)

    @property
    def name(self) -> str:
        """The cell coordinate's value: "poisson", "gamma0.5", "trace-azure" (the file's stem)."""
        if self.process == TRACE:
            return f"{TRACE}-" + re.sub(r"[^A-Za-z0-9.-]", "-", PurePath(self.trace or "").stem)
        return self.process if self.process == POISSON else f"{self.process}{self.shape:g}"

    @classmethod
    def from_name(cls, name: str) -> Arrival:
        """The Poisson or gamma process a coordinate value names (its shape as the name writes
        it); a trace's name does not hold its file, which the cells' context does."""
        if name == POISSON:
            return cls(POISSON)
        return cls(GAMMA, float(name.removeprefix(GAMMA)))


@dataclass(frozen=True)
class Slo:
    """The SLO each request is held to, and what share of a cell's requests must meet it."""

    ttft_ms: float
    tpot_ms: float
    percentile: int  # of TTFT and TPOT, reported against the targets
    attainment: float


@dataclass(frozen=True)
class SearchSettings:
    """The capacity search's bounds: how many cells it may add, how close it stops, and how far
    it steps past the listed rates while they all meet the SLO (or all miss it)."""

    max_probes: int
    tolerance: float  # of the highest rate meeting the SLO
    growth: float


@dataclass(frozen=True)
class Sending:
    """How a load cell sends its requests: what its context holds of the section. The rates,
    classes and processes are the cells' coordinates and the SLO is judged by the dataset,
    so adding a rate or changing the SLO measures no cell again."""

    requests: int
    max_tokens: int
    temperature: float
    warmup: int
    cache_bust: bool
    extra_body: JsonObject
    seed: int
    request_timeout_s: float
    # None changes what a cell's requests are, and a cell's context leaves the default out,
    # so the contexts (the cells' params) of studies measured before the keys existed stay
    # as they were. processes: "auto" or a count (load.load_processes).
    processes: int | str = field(default=AUTO_PROCESSES, metadata=codec.OMITTED_WHEN_DEFAULT)
    min_duration_s: float | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)
    saturation_wait_s: float | None = field(default=30.0, metadata=codec.OMITTED_WHEN_DEFAULT)

    def requests_at(self, rate_req_s: float) -> int:
        """A cell's scheduled requests at ``rate_req_s``: ``requests``, or more where the
        schedule would end before ``min_duration_s`` (a sustained level, not a burst)."""
        if self.min_duration_s is None:
            return self.requests
        return max(self.requests, math.ceil(rate_req_s * self.min_duration_s))


@dataclass(frozen=True)
class LoadSettings:
    """The config's ``load`` section (schema defaults filled in)."""

    prompt_classes: tuple[str, ...]
    prompt_file: str | None
    arrivals: tuple[Arrival, ...]
    rates: tuple[float, ...]
    sending: Sending = field(metadata=codec.INLINE)
    search: SearchSettings
    slo: Slo


def rate_name(rate: float) -> str:
    """The cell coordinate's value of a rate: "0.5", "8"."""
    return f"{rate:g}"


@dataclass(frozen=True)
class Schedule:
    """When each of a cell's requests is to be sent, in seconds from the first."""

    arrival: Arrival
    rate_req_s: float
    seed: int
    offsets_s: tuple[float, ...]


def schedule(arrival: Arrival, rate_req_s: float, requests: int, seed: int) -> Schedule:
    """``requests`` send times at ``rate_req_s`` on average, the first at 0 (Poisson or gamma;
    a trace's are trace.replayed's)."""
    # a string seed is hashed (sha512) by random.Random: the same in every process and run
    draw = random.Random(f"gridbench-load:{seed}:{arrival.name}:{rate_name(rate_req_s)}")
    mean_gap_s = 1 / rate_req_s
    if arrival.process == POISSON:
        gaps = [draw.expovariate(rate_req_s) for _ in range(requests - 1)]
    else:
        shape = arrival.shape or 1.0
        gaps = [draw.gammavariate(shape, mean_gap_s / shape) for _ in range(requests - 1)]
    return Schedule(arrival, rate_req_s, seed, tuple(accumulate(gaps, initial=0.0)))
