"""Per-request metrics and per-level summaries of the natural-prompt harness. Pure.

A request's record is built from the client's own clock readings (``RequestTrace``); the
level's summary is a function of the records alone, so a summary in a result file can be
recomputed from that file's ``requests``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from statistics import fmean

from gridbench.util import codec

OK, ERRORED, INCOMPLETE = "ok", "errored", "incomplete"
# an open-loop level that ended early, saturated (harness.load): the errors of the requests it
# stopped in flight and of those it never sent
STOPPED_EARLY = "stopped: the level ended early, saturated"
NOT_SENT_EARLY = "not sent: the level ended early, saturated"
PERCENTILES = (50, 95, 99)  # a Distribution's fields
# a percentile with fewer samples above it than this is flagged as noise-sensitive
MIN_TAIL_SAMPLES = 5
_DIGITS = 4  # 0.1 µs in ms: far below the clock's and the network's noise


@dataclass(frozen=True)
class RequestTrace:
    """What the client saw of one request, on the ``perf_counter_ns`` clock."""

    index: int
    status: str
    start_ns: int
    end_ns: int  # when the stream ended or the request failed
    text_chunk_ns: tuple[int, ...] = ()  # arrival of every chunk that carried text
    output_tokens: int | None = None  # from the usage block
    finish_reason: str | None = None
    error: str | None = None
    answer: str | None = None  # the answer's text, where the request kept it (ChatRequest.keep_answer)
    counts: tuple[tuple[str, int], ...] = ()  # its usage chunk's integers by dotted key
    connecting_ns: int | None = None  # when its connection started to open
    connected_ns: int | None = None  # when it had opened; None if it never did
    sent: bool = True  # False: it never went out (start_ns is then when it was issued)


def _ms(ns: int) -> float:
    return round(ns / 1e6, _DIGITS)


@dataclass(frozen=True)
class RequestRecord:
    """The contract's per-request record. Timings are None unless the request is ok."""

    index: int
    status: str
    error: str | None
    start_s: float  # from the level's first request out
    end_s: float
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    tpot_ms: float | None = None
    output_tokens: int | None = None
    tokens_per_s: float | None = None
    itl_ms: tuple[float, ...] = ()
    finish_reason: str | None = None


def request_record(trace: RequestTrace, level_start_ns: int) -> RequestRecord:
    """The request's record from what the client saw of it."""
    untimed = RequestRecord(
        index=trace.index,
        status=trace.status,
        error=trace.error,
        start_s=round((trace.start_ns - level_start_ns) / 1e9, 6),
        end_s=round((trace.end_ns - level_start_ns) / 1e9, 6),
        finish_reason=trace.finish_reason,
    )
    if trace.status != OK:
        return untimed
    e2e_ns = trace.end_ns - trace.start_ns
    tokens = trace.output_tokens
    tokens_per_s = round(tokens / (e2e_ns / 1e9), _DIGITS) if tokens is not None and e2e_ns > 0 else None
    ttft_ms = tpot_ms = None
    if trace.text_chunk_ns:
        ttft_ns = trace.text_chunk_ns[0] - trace.start_ns
        ttft_ms = _ms(ttft_ns)
        if tokens is not None and tokens > 1:
            tpot_ms = round((e2e_ns - ttft_ns) / 1e6 / (tokens - 1), _DIGITS)
    return replace(
        untimed,
        ttft_ms=ttft_ms,
        e2e_ms=_ms(e2e_ns),
        tpot_ms=tpot_ms,
        output_tokens=tokens,
        tokens_per_s=tokens_per_s,
        itl_ms=tuple(_ms(b - a) for a, b in itertools.pairwise(trace.text_chunk_ns)),
    )


def nearest_rank(sorted_values: Sequence[float], p: int) -> float | None:
    """The p-th percentile by nearest rank: the smallest value with at least p % at or below it."""
    if not sorted_values:
        return None
    rank = max(1, -(-p * len(sorted_values) // 100))
    return sorted_values[rank - 1]


@dataclass(frozen=True)
class Distribution:
    """One metric over a level's ok requests; None without samples."""

    mean: float | None
    p50: float | None  # the PERCENTILES, by nearest rank
    p95: float | None
    p99: float | None


def _describe(values: list[float]) -> Distribution:
    ordered = sorted(values)
    mean = round(fmean(ordered), _DIGITS) if ordered else None
    return Distribution(mean, *(nearest_rank(ordered, p) for p in PERCENTILES))


def percentile_warnings(sample_counts: dict[str, int]) -> list[str]:
    """Why a percentile means little: too few samples lie above it (per metric, grouped)."""
    warnings = []
    for p in PERCENTILES:
        by_count: dict[int, list[str]] = {}
        for metric, n in sample_counts.items():
            by_count.setdefault(n, []).append(metric)
        for n, metrics in by_count.items():
            unit = "intervals" if metrics == ["itl_ms"] else "requests"
            names = ", ".join(metrics)
            if n == 0:
                if p == PERCENTILES[0]:
                    warnings.append(f"{names}: no samples, every statistic is null")
                continue
            rank = max(1, -(-p * n // 100))
            above = n - rank
            needed = math.ceil(MIN_TAIL_SAMPLES * 100 / (100 - p))
            if above == 0 and n > 1:
                warnings.append(
                    f"p{p} of {names} from {n} {unit} is the maximum: a single sample decides it "
                    f"(>= {needed} {unit} put {MIN_TAIL_SAMPLES} samples above it)"
                )
            elif above == 0:
                warnings.append(f"p{p} of {names} from 1 {unit[:-1]} is that one sample")
            elif above < MIN_TAIL_SAMPLES:
                warnings.append(
                    f"p{p} of {names} from {n} {unit} rests on {above} samples above it: "
                    f"noise-sensitive (>= {needed} {unit} put {MIN_TAIL_SAMPLES} above it)"
                )
    return warnings


@dataclass(frozen=True)
class LevelSummary:
    """A level's summary: counts, aggregate throughput, and each metric's distribution."""

    requests: int
    ok: int
    errored: int
    incomplete: int
    error_rate: float | None  # None for a level of no requests
    wall_s: float
    output_tok_s: float | None
    output_tokens_p50: float | None
    # in the result file, a metric's statistics are flat ``{metric}_{stat}`` keys
    ttft_ms: Distribution = field(metadata=codec.INLINE_PREFIXED)
    tpot_ms: Distribution = field(metadata=codec.INLINE_PREFIXED)
    itl_ms: Distribution = field(metadata=codec.INLINE_PREFIXED)
    e2e_ms: Distribution = field(metadata=codec.INLINE_PREFIXED)
    req_tok_s: Distribution = field(metadata=codec.INLINE_PREFIXED)  # of the records' tokens_per_s
    percentile_warnings: tuple[str, ...]


def _present(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None]


def summarize(records: Sequence[RequestRecord]) -> LevelSummary:
    """The level's summary from its request records (statistics over the ok requests)."""
    ok = [r for r in records if r.status == OK]
    errored = sum(r.status == ERRORED for r in records)
    incomplete = sum(r.status == INCOMPLETE for r in records)
    wall_s = max((r.end_s for r in records), default=0.0) - min((r.start_s for r in records), default=0.0)
    tokens = [r.output_tokens for r in ok if r.output_tokens is not None]
    samples = {  # in the order the warnings name them
        "ttft_ms": _present(r.ttft_ms for r in ok),
        "tpot_ms": _present(r.tpot_ms for r in ok),
        "itl_ms": [gap for r in ok for gap in r.itl_ms],
        "e2e_ms": _present(r.e2e_ms for r in ok),
        "req_tok_s": _present(r.tokens_per_s for r in ok),
    }
    return LevelSummary(
        requests=len(records),
        ok=len(ok),
        errored=errored,
        incomplete=incomplete,
        error_rate=round((errored + incomplete) / len(records), 6) if records else None,
        wall_s=round(wall_s, 6),
        output_tok_s=round(sum(tokens) / wall_s, _DIGITS) if tokens and wall_s > 0 else None,
        output_tokens_p50=nearest_rank(sorted(tokens), 50),
        ttft_ms=_describe(samples["ttft_ms"]),
        tpot_ms=_describe(samples["tpot_ms"]),
        itl_ms=_describe(samples["itl_ms"]),
        e2e_ms=_describe(samples["e2e_ms"]),
        req_tok_s=_describe(samples["req_tok_s"]),
        percentile_warnings=tuple(percentile_warnings({metric: len(v) for metric, v in samples.items()})),
    )


@dataclass(frozen=True)
class WarmupOutcome:
    """How a warm-up request went, for the provenance record."""

    status: str
    error: str | None
    e2e_ms: float
    output_tokens: int | None


def warmup_outcomes(traces: Sequence[RequestTrace]) -> tuple[WarmupOutcome, ...]:
    return tuple(
        WarmupOutcome(t.status, t.error, round((t.end_ns - t.start_ns) / 1e6, 3), t.output_tokens)
        for t in traces
    )
