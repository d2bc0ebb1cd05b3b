"""Per-request metrics and per-level summaries of the natural-prompt harness. Pure.

A request's record is built from the client's own clock readings (``RequestTrace``); the
level's summary is a function of the records alone, so a summary in a result file can be
recomputed from that file's ``requests``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any

OK, ERRORED, INCOMPLETE = "ok", "errored", "incomplete"
PERCENTILES = (50, 95, 99)
SUMMARY_METRICS = {  # summary prefix: request record field
    "ttft_ms": "ttft_ms",
    "tpot_ms": "tpot_ms",
    "itl_ms": "itl_ms",
    "e2e_ms": "e2e_ms",
    "req_tok_s": "tokens_per_s",
}
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


def _ms(ns: int) -> float:
    return round(ns / 1e6, _DIGITS)


def request_record(trace: RequestTrace, level_start_ns: int) -> dict[str, Any]:
    """The contract's per-request record. Timings are null unless the request is ok."""
    record: dict[str, Any] = {
        "index": trace.index,
        "status": trace.status,
        "error": trace.error,
        "start_s": round((trace.start_ns - level_start_ns) / 1e9, 6),
        "end_s": round((trace.end_ns - level_start_ns) / 1e9, 6),
        "ttft_ms": None,
        "e2e_ms": None,
        "tpot_ms": None,
        "output_tokens": None,
        "tokens_per_s": None,
        "itl_ms": [],
        "finish_reason": trace.finish_reason,
    }
    if trace.status != OK:
        return record
    e2e_ns = trace.end_ns - trace.start_ns
    tokens = trace.output_tokens
    record["e2e_ms"] = _ms(e2e_ns)
    record["output_tokens"] = tokens
    if tokens is not None and e2e_ns > 0:
        record["tokens_per_s"] = round(tokens / (e2e_ns / 1e9), _DIGITS)
    if trace.text_chunk_ns:
        first = trace.text_chunk_ns[0]
        ttft_ns = first - trace.start_ns
        record["ttft_ms"] = _ms(ttft_ns)
        if tokens is not None and tokens > 1:
            record["tpot_ms"] = round((e2e_ns - ttft_ns) / 1e6 / (tokens - 1), _DIGITS)
        chunks = trace.text_chunk_ns
        record["itl_ms"] = [_ms(b - a) for a, b in itertools.pairwise(chunks)]
    return record


def nearest_rank(sorted_values: Sequence[float], p: int) -> float | None:
    """The p-th percentile by nearest rank: the smallest value with at least p % at or below it."""
    if not sorted_values:
        return None
    rank = max(1, -(-p * len(sorted_values) // 100))
    return sorted_values[rank - 1]


def _describe(values: list[float]) -> dict[str, float | None]:
    ordered = sorted(values)
    described: dict[str, float | None] = {"mean": round(fmean(ordered), _DIGITS) if ordered else None}
    for p in PERCENTILES:
        described[f"p{p}"] = nearest_rank(ordered, p)
    return described


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


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The level's summary from its request records (statistics over the ok requests)."""
    ok = [r for r in records if r["status"] == OK]
    counts = {status: sum(r["status"] == status for r in records) for status in (OK, ERRORED, INCOMPLETE)}
    wall_s = max((r["end_s"] for r in records), default=0.0) - min(
        (r["start_s"] for r in records), default=0.0
    )
    tokens = [r["output_tokens"] for r in ok if r["output_tokens"] is not None]
    summary: dict[str, Any] = {
        "requests": len(records),
        **counts,
        "error_rate": round((counts[ERRORED] + counts[INCOMPLETE]) / len(records), 6) if records else None,
        "wall_s": round(wall_s, 6),
        "output_tok_s": round(sum(tokens) / wall_s, _DIGITS) if tokens and wall_s > 0 else None,
        "output_tokens_p50": nearest_rank(sorted(tokens), 50),
    }
    sample_counts = {}
    for prefix, field in SUMMARY_METRICS.items():
        if field == "itl_ms":
            values = [gap for r in ok for gap in r["itl_ms"]]
        else:
            values = [r[field] for r in ok if r[field] is not None]
        sample_counts[prefix] = len(values)
        for stat, value in _describe(values).items():
            summary[f"{prefix}_{stat}"] = value
    summary["percentile_warnings"] = percentile_warnings(sample_counts)
    return summary
