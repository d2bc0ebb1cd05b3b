"""Trace replay: a trace file's arrivals and lengths, a load cell's schedule and prompts from
it, and a generated trace shaped like published production traces. Pure, but for read_trace.

A trace is one request a line, as JSON Lines (``{"offset_s": 0.0, "input_tokens": 812,
"output_tokens": 95}``) or as CSV with the header ``offset_s,input_tokens,output_tokens``:
when the request arrives, in seconds from the trace's start, how long its prompt is and how
many tokens it asks for. A cell replays the trace's first ``load.requests`` requests (by
arrival), its first arrival at 0, its time scaled so that the cell's rate is their mean rate
(the trace's burst pattern kept at every rate), each prompt cut or padded to its input length
in words of the packaged corpus and ``max_tokens`` its output length (docs/load-traces.md).
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import accumulate, islice
from pathlib import Path

from gridbench.errors import ConfigError

TRACE = "trace"
FIELDS = ("offset_s", "input_tokens", "output_tokens")


@dataclass(frozen=True)
class TraceEntry:
    """One request of a trace: its arrival, in seconds from the trace's start, and lengths."""

    offset_s: float
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class LoadTrace:
    """A trace arrival's file, as the config names it, and its requests."""

    path: str
    entries: tuple[TraceEntry, ...]


def _entry(values: Sequence[object], where: str) -> TraceEntry:
    """A row's entry from its values in FIELDS' order; a negative arrival or a length below 1
    is an error."""
    try:
        entry = TraceEntry(float(str(values[0])), int(str(values[1])), int(str(values[2])))
    except (IndexError, ValueError) as err:
        raise ConfigError(
            f"{where}: not a trace request ({err})", hint=f"each request needs {', '.join(FIELDS)}"
        ) from err
    if (
        not math.isfinite(entry.offset_s)
        or entry.offset_s < 0
        or min(entry.input_tokens, entry.output_tokens) < 1
    ):
        raise ConfigError(f"{where}: an arrival must be >= 0 s and both lengths >= 1 token")
    return entry


def _rows(text: str, source: str) -> list[list[object]]:
    """Each request's values in FIELDS' order: CSV when ``source`` ends in .csv, else JSON Lines."""
    if source.endswith(".csv"):
        reader = csv.reader(io.StringIO(text))
        header = next(reader, [])
        if tuple(header) != FIELDS:
            raise ConfigError(f"{source}: a CSV trace's header is {','.join(FIELDS)}, not {','.join(header)}")
        return [list(row) for row in reader if row]
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            document = json.loads(line)
            rows.append([document[key] for key in FIELDS])
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ConfigError(
                f"{source}: line {number} is not a trace request ({err!r})",
                hint='one JSON object a line: {"offset_s": 0.0, "input_tokens": 812, "output_tokens": 95}',
            ) from err
    return rows


def parse_trace(text: str, source: str) -> tuple[TraceEntry, ...]:
    """A trace's requests in arrival order: CSV when ``source`` ends in .csv, else JSON Lines."""
    entries = [_entry(row, f"{source}: request {k + 1}") for k, row in enumerate(_rows(text, source))]
    return tuple(sorted(entries, key=lambda e: e.offset_s))


def read_trace(path: str) -> LoadTrace:
    """The trace file a trace arrival names."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError as err:
        raise ConfigError(
            f"load trace {path} does not exist", hint="write one with gridbench load-trace, or fix the path"
        ) from err
    return LoadTrace(path, parse_trace(text, path))


def format_trace(entries: Sequence[TraceEntry], csv_format: bool) -> str:
    """A trace file's text: CSV with its header, or JSON Lines."""
    if not csv_format:
        return "".join(json.dumps(asdict(e)) + "\n" for e in entries)
    out = io.StringIO()
    writer = csv.DictWriter(out, FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(asdict(e) for e in entries)
    return out.getvalue()


def replayed(entries: Sequence[TraceEntry], rate_req_s: float, requests: int) -> tuple[TraceEntry, ...]:
    """The first ``requests`` of a trace, the first arriving at 0 and their time scaled to a
    mean rate of ``rate_req_s`` (``requests - 1`` gaps over the span)."""
    if len(entries) < requests:
        raise ConfigError(
            f"a load trace of {len(entries)} requests cannot replay load.requests = {requests}",
            hint="lower load.requests or use a longer trace",
        )
    first = entries[:requests]
    span_s = first[-1].offset_s - first[0].offset_s
    if span_s <= 0:
        raise ConfigError("a load trace's replayed requests all arrive at once: no rate to scale")
    scale = (requests - 1) / rate_req_s / span_s
    return tuple(
        TraceEntry(round((e.offset_s - first[0].offset_s) * scale, 6), e.input_tokens, e.output_tokens)
        for e in first
    )


def fit_prompt(prompt: str, corpus: Sequence[str], words: int, start: int) -> str:
    """``prompt`` cut or padded to ``words`` words, padded from ``corpus`` (its words, taken
    cyclically from ``start``, so that requests' paddings differ)."""
    if not corpus:
        raise ValueError("an empty corpus pads nothing")
    head = prompt.split()[:words]
    pad = (corpus[(start + k) % len(corpus)] for k in range(words - len(head)))
    return " ".join([*head, *pad])


@dataclass(frozen=True)
class TraceShape:
    """The statistics a generated trace is drawn with (gridbench load-trace).

    The lengths' medians are those the Azure LLM inference trace of 2023 reports for its
    conversation service (Patel et al., "Splitwise", ISCA 2024: median prompt 1020 tokens,
    median output 129 tokens); both are drawn lognormal, whose heavy right tail the published
    length histograms show. The sigmas are ours, not fitted (1.0: the p99 is ~10x the median;
    0.9 for outputs), and lengths are capped at ``max_input`` and ``max_output``. Gaps between
    arrivals are gamma of shape 0.5 (coefficient of variation sqrt(2)), bursty as BurstGPT
    (Wang et al., 2024) reports production arrivals to be, which it models with gamma gaps of
    shape below 1 in bursty periods; the shape is ours too. Nothing is downloaded.
    """

    gamma_shape: float = 0.5
    input_median: float = 1020.0
    input_sigma: float = 1.0
    output_median: float = 129.0
    output_sigma: float = 0.9
    max_input: int = 8192
    max_output: int = 2048


def generate_trace(
    requests: int, rate_req_s: float, seed: int, shape: TraceShape = TraceShape()
) -> tuple[TraceEntry, ...]:
    """``requests`` requests at ``rate_req_s`` on average, seeded, the first at 0."""
    draw = random.Random(f"gridbench-trace:{seed}")
    mean_gap_s = 1 / rate_req_s
    gaps = (draw.gammavariate(shape.gamma_shape, mean_gap_s / shape.gamma_shape) for _ in range(requests - 1))
    offsets = list(islice(accumulate(gaps, initial=0.0), requests))

    def length(median: float, sigma: float, cap: int) -> int:
        return max(1, min(cap, round(draw.lognormvariate(math.log(median), sigma))))

    return tuple(
        TraceEntry(
            round(offset, 6),
            length(shape.input_median, shape.input_sigma, shape.max_input),
            length(shape.output_median, shape.output_sigma, shape.max_output),
        )
        for offset in offsets
    )
