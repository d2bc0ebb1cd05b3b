"""Per-request metrics and level summaries from known timestamps."""

from __future__ import annotations

import json

import pytest

from gridbench.harness.stats import (
    ERRORED,
    INCOMPLETE,
    OK,
    RequestTrace,
    nearest_rank,
    percentile_warnings,
    request_record,
    summarize,
)
from gridbench.util import codec

MS = 1_000_000  # ns


def paced(index: int, start_ms: float, ttft_ms: float, gap_ms: float, tokens: int) -> RequestTrace:
    """A request whose first text chunk comes ttft_ms after its start, then one chunk per gap."""
    start = int(start_ms * MS)
    chunks = tuple(start + int((ttft_ms + k * gap_ms) * MS) for k in range(tokens))
    return RequestTrace(
        index=index,
        status=OK,
        start_ns=start,
        end_ns=chunks[-1],
        text_chunk_ns=chunks,
        output_tokens=tokens,
        finish_reason="length",
    )


def test_request_metrics_from_known_timestamps():
    record = request_record(
        paced(0, start_ms=1000, ttft_ms=120, gap_ms=15, tokens=9), level_start_ns=1000 * MS
    )
    assert record.start_s == 0.0 and record.end_s == pytest.approx(0.24)
    assert record.ttft_ms == 120.0
    assert record.e2e_ms == 240.0  # 120 + 8 gaps of 15
    assert record.tpot_ms == 15.0  # (240 - 120) / (9 - 1)
    assert record.itl_ms == (15.0,) * 8
    assert record.tokens_per_s == pytest.approx(9 / 0.24)
    assert record.output_tokens == 9 and record.finish_reason == "length"


def test_tpot_counts_usage_tokens_not_chunks():
    """Several tokens in one chunk (a speculative burst): TPOT uses the usage count."""
    trace = RequestTrace(0, OK, 0, 300 * MS, text_chunk_ns=(100 * MS, 200 * MS, 300 * MS), output_tokens=21)
    record = request_record(trace, 0)
    assert record.tpot_ms == 10.0  # (300 - 100) / 20
    assert record.itl_ms == (100.0, 100.0)


@pytest.mark.parametrize(
    ("trace", "ttft", "tpot"),
    [
        pytest.param(
            RequestTrace(0, OK, 0, 50 * MS, (50 * MS,), output_tokens=1), 50.0, None, id="one-token"
        ),
        pytest.param(RequestTrace(0, OK, 0, 50 * MS, (), output_tokens=0), None, None, id="no-text"),
    ],
)
def test_undefined_metrics_are_null(trace, ttft, tpot):
    record = request_record(trace, 0)
    assert record.ttft_ms == ttft and record.tpot_ms == tpot


def test_failed_requests_keep_their_reason_and_no_timings():
    trace = RequestTrace(3, ERRORED, 10 * MS, 12 * MS, error="HTTP 500: boom")
    record = request_record(trace, 0)
    assert record.status == ERRORED and record.error == "HTTP 500: boom"
    assert record.end_s == pytest.approx(0.012)
    assert all(
        getattr(record, k) is None for k in ("ttft_ms", "e2e_ms", "tpot_ms", "output_tokens", "tokens_per_s")
    )


@pytest.mark.parametrize(
    ("n", "p", "rank"),
    [
        (16, 50, 8),
        (16, 95, 16),
        (16, 99, 16),
        (20, 95, 19),
        (30, 95, 29),
        (100, 99, 99),
        (1, 50, 1),
        (4, 50, 2),
    ],
)
def test_nearest_rank(n, p, rank):
    assert nearest_rank(list(range(1, n + 1)), p) == rank


def test_level_summary_from_a_scripted_level():
    """Two waves of two requests (c=2): wall, aggregate, percentiles and counts are exact."""
    traces = [
        paced(0, start_ms=0, ttft_ms=100, gap_ms=10, tokens=11),  # ends at 200 ms
        paced(1, start_ms=0, ttft_ms=120, gap_ms=10, tokens=11),  # ends at 220 ms
        paced(2, start_ms=200, ttft_ms=100, gap_ms=20, tokens=6),  # ends at 400 ms
        RequestTrace(3, INCOMPLETE, 220 * MS, 300 * MS, error="stream broke"),
    ]
    records = [request_record(t, 0) for t in traces]
    summary = summarize(records)
    assert (summary.requests, summary.ok, summary.errored, summary.incomplete) == (4, 3, 0, 1)
    assert summary.error_rate == 0.25
    assert summary.wall_s == pytest.approx(0.4)
    assert summary.output_tok_s == pytest.approx((11 + 11 + 6) / 0.4)
    assert summary.output_tokens_p50 == 11
    assert summary.ttft_ms.p50 == 100.0 and summary.ttft_ms.p99 == 120.0
    assert summary.ttft_ms.mean == pytest.approx((100 + 120 + 100) / 3)
    assert summary.tpot_ms.p50 == 10.0 and summary.tpot_ms.p95 == 20.0
    assert summary.itl_ms.p50 == 10.0 and summary.itl_ms.p99 == 20.0  # 20 gaps of 10, 5 of 20
    assert summary.e2e_ms.p50 == 200.0 and summary.e2e_ms.p95 == 220.0
    assert summary.req_tok_s.p50 == pytest.approx(11 / 0.22)
    assert any(
        w.startswith("p95 of ttft_ms, tpot_ms, e2e_ms, req_tok_s from 3 requests")
        for w in summary.percentile_warnings
    )
    json.dumps(codec.to_json(summary), allow_nan=False)  # strict JSON: no NaN anywhere


def test_summary_of_a_level_where_everything_failed_is_null_not_nan():
    records = [request_record(RequestTrace(i, ERRORED, 0, MS, error="HTTP 429: busy"), 0) for i in range(3)]
    summary = summarize(records)
    assert summary.error_rate == 1.0 and summary.output_tok_s is None
    assert summary.ttft_ms.p50 is None and summary.tpot_ms.mean is None
    assert "no samples" in summary.percentile_warnings[0]
    json.dumps(codec.to_json(summary), allow_nan=False)


def test_percentile_warnings_follow_the_tail_size():
    assert percentile_warnings({"ttft_ms": 1000}) == []
    warnings = percentile_warnings({"ttft_ms": 16})
    assert [w.split(" ")[0] for w in warnings] == ["p95", "p99"]
    assert "is the maximum" in warnings[0]
    # the seed's case: p95 at N=30 is sample 29 of 30
    (p95, p99) = percentile_warnings({"ttft_ms": 30})
    assert "rests on 1 samples above it" in p95 and "is the maximum" in p99
    assert [w.split(" ")[0] for w in percentile_warnings({"ttft_ms": 100})] == ["p99"]
