"""A load cell's statistics: offered against achieved rate, the client's schedule lag and
saturation (its result file's summary), and SLO attainment and goodput (the load dataset's,
under the study's SLO as it stands). Pure: functions of the cell's request records, so both
can be recomputed from a result file's ``requests``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import fmean, median

from gridbench.harness.arrivals import Slo
from gridbench.harness.stats import NOT_SENT_EARLY, OK, STOPPED_EARLY, RequestRecord, nearest_rank
from gridbench.util import codec

TTFT, TPOT = "ttft", "tpot"
# TTFT's trend across a cell must add at least this much before it counts as saturation:
# below it, a cell's few ms of noise would read as a queue
SATURATION_FLOOR_MS = 10.0
_DIGITS = 4


@dataclass(frozen=True)
class LoadRequest:
    """One request of a load cell: when it was due, how late the client sent it, and the
    natural harness's record of it (its ``start_s`` is when it was sent)."""

    scheduled_s: float  # from the schedule's origin, as start_s and end_s are
    lag_ms: float | None  # sent minus scheduled; None: never sent (the level ended early)
    record: RequestRecord = field(metadata=codec.INLINE)
    # of the lag, how long past its due time the server took to accept its connection (a
    # full accept backlog: the kernel drops the SYN, the client resends it a second later);
    # None where not recorded (cells measured before it was) or no connection opened
    accept_wait_ms: float | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)


def meets_slo(record: RequestRecord, slo: Slo) -> bool:
    """An ok request whose TTFT and TPOT are within the targets (one token has no TPOT)."""
    if record.status != OK or record.ttft_ms is None or record.ttft_ms > slo.ttft_ms:
        return False
    return record.tpot_ms is None or record.tpot_ms <= slo.tpot_ms


@dataclass(frozen=True)
class LoadSummary:
    """How a load cell went, whatever the SLO: its result file's summary."""

    requests: int
    ok: int
    offered_req_s: float  # the cell's rate
    sent_req_s: float | None  # as the client sent them, first to last
    achieved_req_s: float | None  # ok requests as they ended, first to last (as sent_req_s)
    schedule_lag_ms_p50: float | None
    schedule_lag_ms_p99: float | None
    schedule_lag_ms_max: float | None
    ttft_ms_p50: float | None
    ttft_ms_p99: float | None
    tpot_ms_p50: float | None
    tpot_ms_p99: float | None
    output_tok_s: float | None
    ttft_growth_ms: float | None  # TTFT's least-squares trend over the schedule, first to last
    saturated: bool  # the TTFT trend says so, or the level ended early
    # when the level ended early, from the schedule's origin: a request had waited
    # load.saturation_wait_s for its first token (harness.load); None: it ran its course
    ended_early_s: float | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)


@dataclass(frozen=True)
class LagSplit:
    """A cell's schedule lag by cause, at p99: the client's own (the lag less the accept wait)
    and the server's, waiting for it to accept the connection; None for cells measured
    before the accept wait was recorded."""

    client_lag_ms_p99: float | None
    accept_wait_ms_p99: float | None


def lag_split(requests: Sequence[LoadRequest]) -> LagSplit:
    known = [
        (r.lag_ms, r.accept_wait_ms)
        for r in requests
        if r.lag_ms is not None and r.accept_wait_ms is not None
    ]
    return LagSplit(
        client_lag_ms_p99=_percentile([round(lag - wait, _DIGITS) for lag, wait in known], 99),
        accept_wait_ms_p99=_percentile([wait for _, wait in known], 99),
    )


@dataclass(frozen=True)
class SloOutcome:
    """A load cell judged by an SLO: the load dataset's SLO columns."""

    slo_ttft_ms: float
    slo_tpot_ms: float
    slo_percentile: int
    ttft_ms_at_slo_percentile: float | None
    tpot_ms_at_slo_percentile: float | None
    slo_attainment_required: float
    slo_attainment_share: float  # of all requests, failed ones missing it
    slo_met: bool  # the share reached the required attainment
    binding_constraint: str | None  # "ttft" or "tpot": nearer its target at the percentile
    goodput_req_s: float | None
    goodput_tok_s: float | None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, _DIGITS)


def _percentile(values: Sequence[float], p: int) -> float | None:
    return nearest_rank(sorted(values), p)


def ttft_growth_ms(points: Sequence[tuple[float, float]]) -> float | None:
    """How much TTFT rose from the first request's due time to the last's, by its
    least-squares line over (scheduled_s, ttft_ms): a queue that grows without bound."""
    if len(points) < 3:
        return None
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mean_x, mean_y = fmean(xs), fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        return None
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread
    return slope * (max(xs) - min(xs))


def saturated(points: Sequence[tuple[float, float]]) -> bool:
    """TTFT's trend added more than the first quarter's median TTFT (the queue at least
    doubled it) and more than SATURATION_FLOOR_MS."""
    growth = ttft_growth_ms(points)
    if growth is None:
        return False
    first_quarter = [y for _, y in sorted(points)[: max(1, len(points) // 4)]]
    return growth > max(median(first_quarter), SATURATION_FLOOR_MS)


def binding_constraint(ttft_ms: float | None, tpot_ms: float | None, slo: Slo) -> str | None:
    """The target whose percentile value is the larger share of it."""
    shares = {TTFT: ttft_ms / slo.ttft_ms if ttft_ms is not None else None}
    shares[TPOT] = tpot_ms / slo.tpot_ms if tpot_ms is not None else None
    known = {name: share for name, share in shares.items() if share is not None}
    return max(known, key=lambda name: known[name]) if known else None


def _span_s(requests: Sequence[LoadRequest]) -> float:
    """From the schedule's origin to the last request's end."""
    return max((r.record.end_s for r in requests), default=0.0)


def _per_s(count: float, span_s: float) -> float | None:
    return _round(count / span_s) if span_s > 0 else None


def _rate_req_s(times_s: Sequence[float]) -> float | None:
    """Events per second from the first to the last: n events span n - 1 gaps. (Over the
    time from the origin, n events of a short cell read as a faster rate than was sent.)"""
    ordered = sorted(times_s)
    if len(ordered) < 2 or ordered[-1] <= ordered[0]:
        return None
    return _round((len(ordered) - 1) / (ordered[-1] - ordered[0]))


def summarize(requests: Sequence[LoadRequest], rate_req_s: float) -> LoadSummary:
    """The cell's summary from its requests (times from the schedule's origin)."""
    ok = [r.record for r in requests if r.record.status == OK]
    span_s = _span_s(requests)
    # a level that ended early never sent the rest: no lag, and no part of the sent rate
    lags = [r.lag_ms for r in requests if r.lag_ms is not None]
    ended = [r.record.end_s for r in requests if r.record.error in (STOPPED_EARLY, NOT_SENT_EARLY)]
    ttfts = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    tpots = [r.tpot_ms for r in ok if r.tpot_ms is not None]
    points = [(r.scheduled_s, r.record.ttft_ms) for r in requests if r.record.ttft_ms is not None]
    return LoadSummary(
        requests=len(requests),
        ok=len(ok),
        offered_req_s=rate_req_s,
        sent_req_s=_rate_req_s([r.record.start_s for r in requests if r.lag_ms is not None]),
        achieved_req_s=_rate_req_s([r.end_s for r in ok]),
        schedule_lag_ms_p50=_percentile(lags, 50),
        schedule_lag_ms_p99=_percentile(lags, 99),
        schedule_lag_ms_max=max(lags, default=None),
        ttft_ms_p50=_percentile(ttfts, 50),
        ttft_ms_p99=_percentile(ttfts, 99),
        tpot_ms_p50=_percentile(tpots, 50),
        tpot_ms_p99=_percentile(tpots, 99),
        output_tok_s=_per_s(sum(r.output_tokens or 0 for r in ok), span_s),
        ttft_growth_ms=_round(ttft_growth_ms(points)),
        saturated=saturated(points) or bool(ended),
        ended_early_s=min(ended, default=None),
    )


def slo_outcome(requests: Sequence[LoadRequest], slo: Slo) -> SloOutcome:
    """The cell judged by ``slo``: attainment over every request, goodput over its span."""
    records = [r.record for r in requests]
    good = [r for r in records if meets_slo(r, slo)]
    ok = [r for r in records if r.status == OK]
    ttft_at = _percentile([r.ttft_ms for r in ok if r.ttft_ms is not None], slo.percentile)
    tpot_at = _percentile([r.tpot_ms for r in ok if r.tpot_ms is not None], slo.percentile)
    attainment = len(good) / len(records) if records else 0.0
    span_s = _span_s(requests)
    return SloOutcome(
        slo_ttft_ms=slo.ttft_ms,
        slo_tpot_ms=slo.tpot_ms,
        slo_percentile=slo.percentile,
        ttft_ms_at_slo_percentile=ttft_at,
        tpot_ms_at_slo_percentile=tpot_at,
        slo_attainment_required=slo.attainment,
        slo_attainment_share=round(attainment, 6),
        slo_met=bool(records) and attainment >= slo.attainment,
        binding_constraint=binding_constraint(ttft_at, tpot_at, slo),
        goodput_req_s=_per_s(len(good), span_s),
        goodput_tok_s=_per_s(sum(r.output_tokens or 0 for r in good), span_s),
    )
