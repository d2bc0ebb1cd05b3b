"""Open-loop load cells: the seeded schedule, the goodput and SLO arithmetic, the client
against the paced server's truth (benchmarks/paced_server.py: when each request reached it,
and with slots a capacity fixed by its pacing), the config and the workflow's plan."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import itertools
import json
import multiprocessing
import re
import statistics
import sys
import time
from dataclasses import replace

import pandas as pd
import pytest
import yaml

from conftest import REPO, gridbench, load_yaml, sweep_logs, write_config
from gridbench.aggregate import dataset
from gridbench.aggregate.load import Coordinates, LoadRow, capacities
from gridbench.aggregate.records import ConfigIdentity
from gridbench.assets.corpus import synthetic_book
from gridbench.cells.kinds.load import LOAD, trace_requests
from gridbench.cells.plan import load_plan, natural_plan
from gridbench.cells.search import Search, next_rate, probe_outcome, search_capacity
from gridbench.config.loading import load_grid
from gridbench.errors import ConfigError
from gridbench.harness import goodput, load, natural
from gridbench.harness.arrivals import Arrival, SearchSettings, Sending, Slo, schedule
from gridbench.harness.goodput import LoadRequest, meets_slo, slo_outcome, summarize
from gridbench.harness.stats import ERRORED, NOT_SENT_EARLY, OK, STOPPED_EARLY, RequestRecord, nearest_rank
from gridbench.harness.trace import (
    TraceEntry,
    TraceShape,
    fit_prompt,
    format_trace,
    generate_trace,
    parse_trace,
    read_trace,
    replayed,
)
from gridbench.util import codec
from test_natural_workflow import dry_run_counts
from test_workflow import snakemake

POISSON, BURSTY, REGULAR = Arrival("poisson"), Arrival("gamma", 0.5), Arrival("gamma", 25.0)


def benchmark_module(name: str, monkeypatch: pytest.MonkeyPatch):
    """A script of benchmarks/ as a module, gone again (with what it put on sys.path) after the test."""
    spec = importlib.util.spec_from_file_location(name, REPO / f"benchmarks/{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setattr(sys, "path", [*sys.path])
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def paced_module(monkeypatch):
    return benchmark_module("paced_server", monkeypatch)


# --- the schedule -------------------------------------------------------------------------


def test_a_schedule_is_seeded_starts_at_zero_and_keeps_its_mean_rate():
    first = schedule(POISSON, 4.0, 2000, seed=7)
    assert first == schedule(POISSON, 4.0, 2000, seed=7)  # reproducible
    assert first.offsets_s != schedule(POISSON, 4.0, 2000, seed=8).offsets_s
    assert first.offsets_s[0] == 0 and list(first.offsets_s) == sorted(first.offsets_s)
    assert len(first.offsets_s) == 2000
    for arrival, cv in ((POISSON, 1.0), (BURSTY, 2**0.5), (REGULAR, 0.2)):
        offsets = schedule(arrival, 4.0, 4000, seed=1).offsets_s
        gaps = [b - a for a, b in itertools.pairwise(offsets)]
        assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.08), arrival
        assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(cv, rel=0.12), arrival


def test_an_arrival_names_its_cells_and_is_read_back_from_the_name():
    assert [a.name for a in (POISSON, BURSTY, REGULAR)] == ["poisson", "gamma0.5", "gamma25"]
    for arrival in (POISSON, BURSTY, REGULAR):
        assert Arrival.from_name(arrival.name) == arrival


# --- goodput and the SLO, by hand ------------------------------------------------------------

SLO = Slo(ttft_ms=100, tpot_ms=20, percentile=90, attainment=0.75)


def request(
    index: int, due_s: float, ttft_ms: float | None, tpot_ms: float | None, tokens: int = 11, status: str = OK
) -> LoadRequest:
    end_s = due_s + ((ttft_ms or 0) + (tpot_ms or 0) * (tokens - 1)) / 1e3
    record = RequestRecord(
        index=index,
        status=status,
        error=None if status == OK else "HTTP 503",
        start_s=due_s + 0.001,
        end_s=end_s,
        ttft_ms=ttft_ms,
        tpot_ms=tpot_ms,
        output_tokens=tokens if status == OK else None,
    )
    return LoadRequest(scheduled_s=due_s, lag_ms=1.0 + index / 10, record=record)


def test_goodput_counts_only_requests_meeting_both_targets():
    requests = [
        request(0, 0.0, 50, 10),  # meets both
        request(1, 0.5, 100, 20),  # on both targets: meets
        request(2, 1.0, 101, 10),  # TTFT over
        request(3, 1.5, 50, 25),  # TPOT over
        request(4, 2.0, 50, None, tokens=1),  # one token: no TPOT to miss
        request(5, 2.5, None, None, status=ERRORED),  # a failed request meets nothing
        request(6, 3.0, 60, 10),
        request(7, 3.5, 70, 10),  # ends at 3.5 + 0.17 s
    ]
    assert [meets_slo(r.record, SLO) for r in requests] == [True, True, False, False, True, False, True, True]
    outcome = slo_outcome(requests, SLO)
    assert outcome.slo_attainment_share == 5 / 8
    assert not outcome.slo_met  # 0.625 < 0.75
    span_s = 3.5 + 0.17
    assert outcome.goodput_req_s == pytest.approx(5 / span_s, abs=1e-4)
    assert outcome.goodput_tok_s == pytest.approx((11 + 11 + 1 + 11 + 11) / span_s, abs=1e-4)
    ttfts = sorted([50, 100, 101, 50, 50, 60, 70])
    assert outcome.ttft_ms_at_slo_percentile == nearest_rank(ttfts, 90) == 101
    assert outcome.tpot_ms_at_slo_percentile == 25
    assert outcome.binding_constraint == "tpot"  # 25/20 of its target against 101/100
    assert slo_outcome(requests, Slo(200, 30, 90, 0.75)).slo_met  # every ok request then meets: 7/8


def test_the_summary_reports_rates_lag_and_the_ttft_trend():
    steady = [request(i, i * 0.1, 40 + (i % 2), 10) for i in range(20)]
    summary = summarize(steady, rate_req_s=10)
    assert (summary.requests, summary.ok, summary.offered_req_s) == (20, 20, 10)
    assert summary.sent_req_s == pytest.approx(10, rel=1e-6)
    assert summary.schedule_lag_ms_p50 == 1.9 and summary.schedule_lag_ms_max == 2.9
    assert abs(summary.ttft_growth_ms) < 1 and not summary.saturated
    # a queue: each request waits 20 ms longer than the one before
    queued = [request(i, i * 0.1, 40 + 20 * i, 10) for i in range(20)]
    summary = summarize(queued, rate_req_s=10)
    assert summary.ttft_growth_ms == pytest.approx(20 * 19, rel=1e-6)
    assert summary.saturated
    # growth under the floor is noise, however small the TTFT
    assert not goodput.saturated([(i * 0.1, 1 + 0.4 * i) for i in range(20)])


def test_capacity_is_the_highest_passing_rate_below_the_first_failing_one():
    config = load_grid(load_yaml(REPO / "config/mechanism.yaml"), "mechanism.yaml").configs["D_f16_n0"]
    identity = ConfigIdentity.from_config(config)

    def row(rate: float, ttft_ms: float) -> LoadRow:
        requests = [request(i, i / rate, ttft_ms, 10) for i in range(10)]
        return LoadRow(
            identity,
            Coordinates("code", "poisson", rate),
            dataset.Status("ok"),
            summary=summarize(requests, rate),
            lag=goodput.lag_split(requests),
            slo=slo_outcome(requests, SLO),
        )

    # 8 req/s passing above a failing 4 is noise: the capacity stays 2, TTFT at 90 % of its target
    rows = [row(1, 50), row(2, 90), row(4, 150), row(8, 60)]
    (found,) = capacities(rows)
    assert (found.capacity_req_s, found.first_failing_req_s) == (2, 4)
    assert found.binding_constraint == "ttft" and found.goodput_tok_s == rows[1].slo.goodput_tok_s
    (none,) = capacities([row(1, 150)])
    assert none.capacity_req_s is None and none.first_failing_req_s == 1


# --- against the paced server --------------------------------------------------------------


def open_loop(
    base_url: str, arrival: Arrival, rate: float, requests: int, tokens: int, processes: int = 1
) -> load.OpenLoopRun:
    plan = natural.LevelPlan(
        prompt="Write a story.",
        concurrency=1,
        requests=requests,
        warmup=0,
        max_tokens=tokens,
        temperature=0,
        cache_bust=True,
        extra_body={},
        request_timeout_s=60,
    )
    sent = [plan.request(i) for i in range(requests)]
    offsets = schedule(arrival, rate, requests, seed=0).offsets_s
    return load.run_open_loop(natural.Endpoint(base_url, "paced"), sent, offsets, 60, processes=processes)


def most_in_flight(run: load.OpenLoopRun) -> int:
    events = sorted([(t.start_ns, 1) for t in run.traces] + [(t.end_ns, -1) for t in run.traces])
    in_flight = most = 0
    for _, step in events:
        in_flight += step
        most = max(most, in_flight)
    return most


@pytest.mark.integration  # a real server process, timed: never beside the demo sweep
def test_the_open_loop_keeps_its_schedule_whatever_the_server_takes(paced_module, monkeypatch):
    """50 req/s of 200 ms streams: ~10 in flight, each sent on time, never after another ended."""
    rate, count = 50.0, 150
    # the reference: a bare loop waking at the same due times at the same time, in a process
    # of its own (the benchmark's own)
    alongside = benchmark_module("load_schedule", monkeypatch).reference_alongside
    with paced_module.PacedServer(ttft_ms=50, gap_ms=6, tokens=26, processes=1) as server:
        with alongside(schedule(POISSON, rate, count, seed=0).offsets_s) as reference_lags:
            run = open_loop(server.base_url, POISSON, rate, count, tokens=26)
            reference = sorted(reference_lags())
        truth = server.take_log()
    requests = load.load_requests(run)
    assert [t.status for t in run.traces] == [OK] * count
    lags = sorted(r.lag_ms for r in requests)
    assert lags[0] >= 0  # never early
    # opening a connection costs no lag (~1 ms without the lead), and the client adds little to
    # what this shared 2-core machine's scheduler gives any loop meanwhile; benchmarks/load_schedule.py
    # measures it against the 1 ms
    assert nearest_rank(lags, 50) < 1.0, lags[:5]
    assert nearest_rank(lags, 99) < nearest_rank(reference, 99) + 10, (lags[-5:], reference[-5:])
    assert most_in_flight(run) > 5  # open: sends never waited for completions
    # the server saw each request when the client says it sent it (its kernel's stamp)
    arrivals = {int(re.match(r"\[bench-(\d+)\]", e["prompt"]).group(1)): e["arrival"] for e in truth}
    for trace in run.traces:
        assert 0 <= arrivals[trace.index] - trace.start_ns < 5e6
    summary = summarize(requests, rate)
    # sent at the schedule's own rate (the seeded draw's, near the offered one)
    assert summary.sent_req_s == pytest.approx((count - 1) / requests[-1].scheduled_s, rel=0.02)
    assert summary.sent_req_s == pytest.approx(rate, rel=0.25)
    assert not summary.saturated  # the paced server has no queue without slots


@pytest.mark.integration  # a real server process, timed: never beside the demo sweep
def test_a_schedule_dealt_across_two_processes_is_sent_on_time_from_both(paced_module):
    """Each process sends every second request from its own loop (and reads only those
    streams), both timed from one origin; the run's records are the one loop's, by index."""
    rate, count = 50.0, 60
    workers_alive = []
    plan = natural.LevelPlan("Write a story.", 1, count, 0, 26, 0, True, {}, 60)
    offsets = schedule(POISSON, rate, count, seed=0).offsets_s
    with paced_module.PacedServer(ttft_ms=50, gap_ms=6, tokens=26, processes=1) as server:
        run = load.run_open_loop(
            natural.Endpoint(server.base_url, "paced"),
            [plan.request(i) for i in range(count)],
            offsets,
            60,
            lambda _trace: workers_alive.append(len(multiprocessing.active_children())),
            processes=2,
        )
        truth = server.take_log()
    assert min(workers_alive) == 2  # every trace came back from a worker process
    assert [t.index for t in run.traces] == list(range(count))
    assert [t.status for t in run.traces] == [OK] * count
    assert run.due_ns == tuple(run.origin_ns + round(offset * 1e9) for offset in offsets)
    lags = sorted(r.lag_ms for r in load.load_requests(run))
    assert lags[0] >= 0 and nearest_rank(lags, 50) < 1.0, lags[:5]
    arrivals = {int(re.match(r"\[bench-(\d+)\]", e["prompt"]).group(1)): e["arrival"] for e in truth}
    for trace in run.traces:  # the server saw each request when its process says it sent it
        assert 0 <= arrivals[trace.index] - trace.start_ns < 5e6
    assert most_in_flight(run) > 5
    # each connection opened before its request was due (the workers' traces say when)
    assert {r.accept_wait_ms for r in load.load_requests(run)} == {0.0}


@pytest.mark.integration  # a real server process, timed: never beside the demo sweep
def test_a_request_the_server_was_slow_to_accept_is_late_by_the_servers_wait_not_the_clients(paced_module):
    """An engine too busy to accept has a full accept backlog: the kernel drops a connection
    attempt and the client's kernel resends it a second later. Such a request goes out late,
    and its record says how much of that the server's accept took, and how little the client."""
    plan = natural.LevelPlan("Write a story.", 1, 4, 0, 4, 0, True, {}, 60)
    offsets = (0.0, 0.01, 0.02, 0.03)
    with paced_module.PacedServer(ttft_ms=5, gap_ms=1, tokens=4, processes=1, accept_after_ms=300) as server:
        endpoint = natural.Endpoint(server.base_url, "paced")
        run = load.run_open_loop(endpoint, [plan.request(i) for i in range(4)], offsets, 60)
    assert [t.status for t in run.traces] == [OK] * 4
    first, *dropped = load.load_requests(run)
    # the backlog's one place: connected at once, sent on time, served once accepted
    assert first.accept_wait_ms == 0 and first.lag_ms < 5, first
    for request in dropped:  # connected a second later, and sent as soon as connected
        assert request.accept_wait_ms > 500 and request.lag_ms - request.accept_wait_ms < 5, request
    split = goodput.lag_split(load.load_requests(run))
    assert split.accept_wait_ms_p99 > 500 and split.client_lag_ms_p99 < 5, split


def test_the_lag_split_is_unknown_for_cells_measured_before_the_accept_wait_was_recorded():
    record = RequestRecord(index=0, status=OK, error=None, start_s=0.0, end_s=0.1, finish_reason="stop")
    older = [LoadRequest(scheduled_s=0.0, lag_ms=0.5, record=record)]
    assert goodput.lag_split(older) == goodput.LagSplit(None, None)
    newer = [LoadRequest(scheduled_s=0.0, lag_ms=1200.5, record=record, accept_wait_ms=1200.0)]
    assert goodput.lag_split(newer) == goodput.LagSplit(client_lag_ms_p99=0.5, accept_wait_ms_p99=1200.0)


@pytest.mark.parametrize(
    ("setting", "rate", "requests", "cpus", "processes"),
    [
        ("auto", 4, 48, 16, 1),  # one loop sends 8 req/s on time
        ("auto", 17, 48, 16, 3),
        ("auto", 1024, 48, 16, 8),  # at most half the CPUs: the engine may share the host
        ("auto", 64, 48, 2, 1),
        ("auto", 64, 48, None, 1),
        (4, 64, 48, 2, 4),  # as asked
        (4, 64, 3, 16, 3),  # never more than the requests
    ],
)
def test_a_cells_harness_processes(setting, rate, requests, cpus, processes):
    assert load.load_processes(setting, rate, requests, cpus) == processes


def test_a_minimum_duration_makes_a_high_rate_a_sustained_level():
    sending = Sending(48, 64, 0, 0, True, {}, 0, 60, min_duration_s=10)
    assert [sending.requests_at(rate) for rate in (1, 4.8, 4.81, 64)] == [48, 48, 49, 640]
    assert replace(sending, min_duration_s=None).requests_at(64) == 48


@pytest.mark.integration  # a real server process, timed: never beside the demo sweep
def test_no_collection_during_the_schedule_scans_what_the_process_held_before_it(paced_module):
    """A full collection of a cell process's heap takes ~10 ms (benchmarks/load_schedule.py
    prints it): on the H100 one request in each of two saturated cells went out 12-14 ms late.
    While the schedule runs, everything alive before it is frozen out of the collector's reach
    (so a collection then scans only the run's own objects), and released after."""
    plan = natural.LevelPlan("Write a story.", 1, 8, 0, 4, 0, True, {}, 60)
    before = len(gc.get_objects())
    frozen_while_sending = []
    with paced_module.PacedServer(ttft_ms=5, gap_ms=1, tokens=4, processes=1) as server:
        asyncio.run(
            load.send_open_loop(
                natural.Endpoint(server.base_url, "paced"),
                [plan.request(i) for i in range(8)],
                schedule(POISSON, 50.0, 8, seed=0).offsets_s,
                60,
                lambda _trace: frozen_while_sending.append(gc.get_freeze_count()),
            )
        )
    assert len(frozen_while_sending) == 8
    assert min(frozen_while_sending) >= 0.9 * before, (before, frozen_while_sending)
    assert gc.get_freeze_count() == 0


# the paced server with 2 slots of 20 ms TTFT and 16 more tokens every 5 ms: 100 ms a request,
# a capacity of 20 req/s; TTFT stays near 20 ms below it and grows without bound above it
SLOTS, TTFT_MS, GAP_MS, TOKENS = 2, 20, 5, 17
CAPACITY_REQ_S = SLOTS / ((TTFT_MS + (TOKENS - 1) * GAP_MS) / 1e3)
PROBED_RATES = (8.0, 14.0, 26.0, 36.0)


@pytest.mark.integration  # a real server process, timed: never beside the demo sweep
@pytest.mark.parametrize("processes", [1, 2])
def test_a_level_far_past_capacity_ends_early_with_every_request_recorded(paced_module, processes):
    """100 req/s against a capacity of 20: the queue grows until a request has waited 0.3 s for
    its first token; then the requests in flight are stopped and the rest not sent, each
    recorded as such, and the level says when it ended (across processes, one ends them all)."""
    rate, count = 100.0, 80
    plan = natural.LevelPlan("Write a story.", 1, count, 0, TOKENS, 0, True, {}, 60)
    offsets = schedule(REGULAR, rate, count, seed=0).offsets_s
    with paced_module.PacedServer(TTFT_MS, GAP_MS, TOKENS, processes=1, slots=SLOTS) as server:
        started = time.monotonic()
        run = load.run_open_loop(
            natural.Endpoint(server.base_url, "paced"),
            [plan.request(i) for i in range(count)],
            offsets,
            60,
            processes=processes,
            saturation_wait_s=0.3,
        )
        took_s = time.monotonic() - started
    requests = load.load_requests(run)
    errors = [r.record.error for r in requests]
    assert len(requests) == count and [t.index for t in run.traces] == list(range(count))
    first_stopped = errors.index(STOPPED_EARLY)
    # served in order until the queue was too long; then stopped in flight, and none sent after
    assert first_stopped > 5 and all(r.record.status == OK for r in requests[: first_stopped // 2])
    assert set(errors[first_stopped:]) <= {STOPPED_EARLY, NOT_SENT_EARLY, None}
    assert NOT_SENT_EARLY in errors and errors[-1] == NOT_SENT_EARLY
    unsent = [r for r in requests if r.record.error == NOT_SENT_EARLY]
    assert all(r.lag_ms is None and r.accept_wait_ms is None for r in unsent)
    summary = summarize(requests, rate)
    # a request due at t waits 0.3 s: the level ends near 0.3 s plus the queue's start, well
    # before its 0.8 s schedule and its ~4 s of queued work would have ended
    assert summary.saturated and 0.3 < summary.ended_early_s < 0.8, summary
    assert took_s < 2.5, took_s
    assert summary.schedule_lag_ms_p99 is not None and summary.schedule_lag_ms_p99 < 20
    assert not slo_outcome(requests, Slo(ttft_ms=150, tpot_ms=15, percentile=90, attainment=0.9)).slo_met


@pytest.mark.integration  # a real server process, timed: never beside the demo sweep
def test_the_highest_rate_meeting_the_slo_brackets_the_paced_servers_capacity(paced_module):
    slo = Slo(ttft_ms=150, tpot_ms=15, percentile=90, attainment=0.9)
    outcomes = {}
    with paced_module.PacedServer(TTFT_MS, GAP_MS, TOKENS, processes=1, slots=SLOTS) as server:
        for rate in PROBED_RATES:
            run = open_loop(server.base_url, REGULAR, rate, 48, tokens=TOKENS)
            requests = load.load_requests(run)
            outcomes[rate] = (slo_outcome(requests, slo), summarize(requests, rate))
    passing = [rate for rate, (outcome, _) in outcomes.items() if outcome.slo_met]
    failing = [rate for rate, (outcome, _) in outcomes.items() if not outcome.slo_met]
    assert passing and failing, outcomes
    assert max(passing) < CAPACITY_REQ_S < min(failing), outcomes
    assert max(passing) < min(failing)  # no rate passes above a failing one
    # saturation is measured, not inferred from the SLO: the queue grew only above capacity
    assert [outcomes[r][1].saturated for r in PROBED_RATES] == [r > CAPACITY_REQ_S for r in PROBED_RATES]
    # above capacity the engine completes at its capacity, not at the offered rate
    achieved = outcomes[36.0][1].achieved_req_s
    assert achieved == pytest.approx(CAPACITY_REQ_S, rel=0.2)


# --- trace replay ----------------------------------------------------------------------------


def test_a_generated_trace_is_seeded_bursty_heavy_tailed_and_read_back_in_both_formats():
    entries = generate_trace(4000, 4.0, seed=3)
    assert entries == generate_trace(4000, 4.0, seed=3) and entries != generate_trace(4000, 4.0, seed=4)
    gaps = [b.offset_s - a.offset_s for a, b in itertools.pairwise(entries)]
    assert entries[0].offset_s == 0 and min(gaps) >= 0
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.1)
    assert statistics.stdev(gaps) / statistics.fmean(gaps) > 1.2  # gamma 0.5: sqrt(2), burstier than Poisson
    shape = TraceShape()
    for lengths, median in (
        (sorted(e.input_tokens for e in entries), shape.input_median),
        (sorted(e.output_tokens for e in entries), shape.output_median),
    ):
        assert nearest_rank(lengths, 50) == pytest.approx(median, rel=0.1)
        assert nearest_rank(lengths, 99) > 5 * nearest_rank(lengths, 50)  # the heavy tail
    for name in ("t.csv", "t.jsonl"):
        assert parse_trace(format_trace(entries, csv_format=name.endswith(".csv")), name) == entries
    with pytest.raises(ConfigError, match="request 2: an arrival must be >= 0 s"):
        parse_trace("offset_s,input_tokens,output_tokens\n0,5,5\n-1,5,5\n", "t.csv")
    with pytest.raises(ConfigError, match="line 2 is not a trace request"):
        parse_trace('{"offset_s": 0, "input_tokens": 5, "output_tokens": 5}\n{"offset_s": 1}\n', "t.jsonl")


def test_a_trace_is_replayed_from_its_first_arrival_at_the_cells_rate():
    trace = [TraceEntry(10.0, 5, 7), TraceEntry(10.5, 6, 8), TraceEntry(12.0, 7, 9), TraceEntry(13.0, 8, 1)]
    # the first three: two gaps over 2 s, scaled to 4 req/s (0.5 s)
    assert replayed(trace, 4.0, 3) == (TraceEntry(0.0, 5, 7), TraceEntry(0.125, 6, 8), TraceEntry(0.5, 7, 9))
    with pytest.raises(ConfigError, match=r"a load trace of 4 requests cannot replay load\.requests = 5"):
        replayed(trace, 4.0, 5)
    assert fit_prompt("one two three", ["a", "b"], 2, start=0) == "one two"
    assert fit_prompt("one two", ["a", "b", "c"], 5, start=2) == "one two c a b"


def test_a_trace_arrival_names_its_cells_and_its_context_holds_the_trace(tmp_path):
    path = tmp_path / "azure conv.csv"
    path.write_text(format_trace(generate_trace(8, 2.0, seed=0), csv_format=True))
    section = {"arrivals": [{"process": "trace", "trace": str(path)}], "rates": [2], "requests": 8}
    grid = load_grid(mechanism_with(section), "mechanism.yaml")
    plan = load_plan(grid)
    assert plan.cells[0].files.raw == "results/load/D_f16_n0/dialogue_trace-azure-conv_r2.json"
    assert str(path) in LOAD.host_files(grid, "D_f16_n0")
    context = tmp_path / "context.json"
    context.write_text(json.dumps(codec.to_json(LOAD.context(grid, "D_f16_n0", ["cpu"]))))
    cell = LOAD.load(context, {"prompt_class": "dialogue", "arrival": "trace-azure-conv", "rate": "2"})
    assert cell.arrival == Arrival("trace", trace=str(path)) and cell.arrival.name == "trace-azure-conv"
    assert cell.trace == read_trace(str(path)).entries
    # a study without traces keeps its contexts' keys, so its cells are not measured again
    plain = load_grid(mechanism_with({"rates": [2]}), "mechanism.yaml")
    assert "traces" not in codec.to_json(LOAD.context(plain, "D_f16_n0", ["cpu"]))
    assert "trace" not in codec.to_json(POISSON)


def test_the_workflow_plans_trace_cells_and_a_missing_trace_is_a_clear_error(tmp_path):
    trace = tmp_path / "burst.jsonl"
    gridbench("load-trace", "--out", str(trace), "--requests", "16", "--rate", "2")
    section = {"arrivals": [{"process": "trace", "trace": str(trace)}], "rates": [1, 2], "requests": 16}
    config = tmp_path / "grid.yaml"
    config.write_text(yaml.safe_dump(mechanism_with(section)))
    # Snakemake writes each cell's context, the trace's requests in it, as the rule's params
    assert dry_run_counts(tmp_path, "--configfile", str(config))["load_cell"] == 4 * 2
    trace.unlink()
    grid = load_grid(mechanism_with(section), "mechanism.yaml")
    with pytest.raises(ConfigError, match=r"load trace .*burst\.jsonl does not exist"):
        LOAD.context(grid, "D_f16_n0", ["cpu"])


@pytest.mark.integration  # a real server process, timed: never beside the demo sweep
def test_a_generated_trace_replayed_against_the_paced_server_keeps_its_schedule_and_lengths(
    paced_module, monkeypatch, tmp_path
):
    """The CLI's trace, replayed at 20 req/s: each request on time and asking for its length.
    The server sends at most 16 tokens 5 ms apart: the trace's long outputs (up to 2048) as
    1 ms streams would have the one client loop read ~40 000 chunks a second on a shared
    2-core machine, whose lateness is the machine's, not the schedule's."""
    rate, count = 20.0, 40
    path = tmp_path / "trace.jsonl"
    gridbench("load-trace", "--out", str(path), "--requests", "60", "--rate", "5", "--seed", "2")
    plan = natural.LevelPlan("Write a story.", 1, count, 0, 16, 0, True, {}, 60)
    entries = replayed(read_trace(str(path)).entries, rate, count)
    sent = trace_requests(plan, entries, synthetic_book(paragraphs=200).split())
    assert [len(r.text.split()) for r in sent] == [e.input_tokens for e in entries]
    assert [r.max_tokens for r in sent] == [e.output_tokens for e in entries]
    offsets = tuple(e.offset_s for e in entries)
    alongside = benchmark_module("load_schedule", monkeypatch).reference_alongside
    with paced_module.PacedServer(ttft_ms=20, gap_ms=5, tokens=16, processes=1) as server:
        with alongside(offsets) as reference_lags:
            endpoint = natural.Endpoint(server.base_url, "paced")
            run = asyncio.run(load.send_open_loop(endpoint, sent, offsets, 60))
            reference = sorted(reference_lags())
        truth = server.take_log()
    assert [t.status for t in run.traces] == [OK] * count
    lags = sorted(r.lag_ms for r in load.load_requests(run))
    assert lags[0] >= 0 and nearest_rank(lags, 50) < 1.0, lags[:5]
    assert nearest_rank(lags, 99) < nearest_rank(reference, 99) + 10, (lags[-5:], reference[-5:])
    # the server saw each request when the client says it sent it (the lag above is from the
    # due time to then), asking for its trace's output length
    seen = {int(re.match(r"\[bench-(\d+)\]", e["prompt"]).group(1)): e for e in truth}
    for trace, entry in zip(run.traces, entries, strict=True):
        assert 0 <= seen[trace.index]["arrival"] - trace.start_ns < 5e6
        assert seen[trace.index]["asked"] == entry.output_tokens
        assert seen[trace.index]["tokens"] == trace.output_tokens == min(16, entry.output_tokens)


# --- the config and the plan ---------------------------------------------------------------


def mechanism_with(load_section: dict) -> dict:
    config = load_yaml(REPO / "config/mechanism.yaml")
    config["load"] = load_section
    return config


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"rate": [1]}, r"key load: .*'rate' was unexpected.*allowed keys: arrivals, .*rates"),
        ({"slo": {"ttft": 200}}, r"key load.slo: .*'ttft' was unexpected.*ttft_ms"),
        ({"arrivals": [{"process": "gamma"}]}, r"key load.arrivals.0: gamma needs a shape"),
        ({"arrivals": [{"process": "poisson", "shape": 2}]}, r"key load.arrivals.0: poisson takes no shape"),
        ({"arrivals": [{"process": "uniform"}]}, r"key load.arrivals.0.process: 'uniform' is not allowed"),
        ({"rates": [0]}, r"key load.rates.0"),
        ({"arrivals": [{"process": "poisson"}, {"process": "poisson"}]}, "listed twice"),
        ({"arrivals": [{"process": "trace"}]}, r"key load.arrivals.0: trace needs a trace file"),
        ({"arrivals": [{"process": "poisson", "trace": "t.jsonl"}]}, r"poisson takes no trace file"),
        ({"arrivals": [{"process": "trace", "trace": "t.csv", "shape": 1}]}, r"trace takes no shape"),
    ],
)
def test_a_mistyped_load_section_is_a_clear_error(section, message):
    with pytest.raises(ConfigError, match=message):
        load_grid(mechanism_with(section), "mechanism.yaml")


def test_an_unknown_prompt_class_stops_the_plan():
    grid = load_grid(mechanism_with({"prompt_classes": ["poetry"]}), "mechanism.yaml")
    with pytest.raises(ConfigError, match=r"load\.prompt_classes: unknown class poetry"):
        load_plan(grid)


def test_the_workflow_plans_one_load_cell_per_config_class_arrival_and_rate(tmp_path):
    section = {
        "prompt_classes": ["code", "dialogue"],
        "arrivals": [{"process": "poisson"}, {"process": "gamma", "shape": 0.5}],
        "rates": [0.5, 2, 4],
    }
    config = tmp_path / "grid.yaml"
    config.write_text(yaml.safe_dump(mechanism_with(section)))
    counts = dry_run_counts(tmp_path, "--configfile", str(config))
    assert counts["load_cell"] == 4 * 2 * 2 * 3  # the mechanism grid's four configs
    assert counts["build_load_dataset"] == 1
    grid = load_grid(mechanism_with(section), "mechanism.yaml")
    # the natural matrix keeps its cells beside them (a prompt_class wildcard of both kinds)
    assert counts["natural_cell"] == len(natural_plan(grid).cells) > 0
    plan = load_plan(grid)
    assert plan.cells[0].files.raw == "results/load/D_f16_n0/code_poisson_r0.5.json"
    assert [c.rate_req_s for c in plan.cells[:3]] == [0.5, 2, 4]


# --- the workflow, on the CPU engine -------------------------------------------------------


@pytest.mark.workflow
def test_the_workflow_measures_load_cells_on_llamacpp_and_writes_the_load_dataset(workdir, demo_config):
    demo_config["configs"] = {"D_q8_0_n0": demo_config["configs"]["D_q8_0_n0"]}
    demo_config["depths"] = []  # load cells only
    del demo_config["natural"]
    rates = [1.0, 2.0, 4.0]
    demo_config["load"] = {
        "prompt_classes": ["code"],
        "rates": rates,
        "requests": 6,
        "max_tokens": 8,
        "warmup": 1,
        "processes": 2,
        "min_duration_s": 2.5,  # 4 req/s for 2.5 s: 10 requests
    }
    write_config(workdir / "grid.yaml", demo_config)
    result = snakemake(workdir, "--configfile", "grid.yaml")
    assert result.returncode == 0, result.stdout + result.stderr + sweep_logs(workdir)

    frame = pd.read_csv(workdir / "dataset/load.csv")
    assert frame["rate_req_s"].tolist() == rates and set(frame["status"]) == {"ok"}
    assert set(frame["config"]) == {"D_q8_0_n0"} and set(frame["arrival"]) == {"poisson"}
    assert frame["requests"].tolist() == frame["ok"].tolist() == [6, 6, 10]
    # a tiny model far below its capacity: sent on schedule, every request within the SLO
    assert (frame["sent_req_s"] / frame["offered_req_s"]).between(0.3, 3).all(), frame["sent_req_s"]
    # far below capacity, requests end as they were sent (both first to last)
    assert frame["achieved_req_s"].tolist() == pytest.approx(frame["sent_req_s"].tolist(), rel=0.25)
    assert (frame["schedule_lag_ms_p99"] >= 0).all()
    assert (frame["schedule_lag_ms_p99"] < 50).all(), frame["schedule_lag_ms_p99"]
    assert frame["slo_met"].all()
    assert (frame["goodput_req_s"] > 0).all() and (frame["goodput_tok_s"] > 0).all()
    for rate, count in (("1", 6), ("2", 6), ("4", 10)):
        cell = workdir / f"results/load/D_q8_0_n0/code_poisson_r{rate}"
        raw = json.loads(cell.with_suffix(".json").read_text())
        assert raw["schema"] == load.SCHEMA and len(raw["requests"]) == count
        prov = json.loads(cell.with_suffix(".provenance.json").read_text())
        assert prov["bench"]["harness_processes"] == 2

    report = (workdir / "dataset/comparison.md").read_text()
    capacity = report.split("## Capacity under the SLO (open-loop load)\n", 1)[1].split("\n## ", 1)[0]
    # no rate failed: the capacity is the highest rate measured, a lower bound, and says so
    assert "| `D_q8_0_n0` | code | poisson | at least 4 req/s |" in capacity
    assert capacity.count("| `D_q8_0_n0` | code | poisson | ") == 1 + len(rates)  # capacity, then each cell
    verdict = report.split("## Verdict\n", 1)[1].split("\n## ", 1)[0]
    assert "Most load under the SLO (TTFT ≤ 2000 ms and TPOT ≤ 100 ms for ≥ 90 % of requests)" in verdict
    assert "code at poisson arrivals: D_q8_0_n0, at least 4 req/s" in verdict
    assert "Mechanism check" in verdict  # random weights

    # the workflow's end on error builds the same load dataset and section from the cells
    grid_file = workdir / "grid.json"
    grid_file.write_text(json.dumps(load_grid(demo_config, "grid.yaml").document, default=str))
    gridbench("finalize", "--grid", str(grid_file), "--outdir", "partial", cwd=workdir)
    assert (workdir / "partial/dataset/load.csv").read_text() == (workdir / "dataset/load.csv").read_text()
    assert capacity in (workdir / "partial/dataset/comparison.md").read_text()
    # the load graph, drawn by the workflow and by the end on error, and shown in the report
    for root in (workdir, workdir / "partial"):
        assert (root / "graphs/load_slo_vs_rate.png").stat().st_size > 0
    assert "![load_slo_vs_rate](../graphs/load_slo_vs_rate.png)" in report

    measured_at = {p: p.stat().st_mtime_ns for p in workdir.glob("results/load/*/*.json")}
    again = snakemake(workdir, "--configfile", "grid.yaml")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
    assert {p: p.stat().st_mtime_ns for p in workdir.glob("results/load/*/*.json")} == measured_at


# --- the capacity search -------------------------------------------------------------------


def test_the_next_rate_bisects_the_bracket_until_the_tolerance():
    settings = SearchSettings(max_probes=4, tolerance=0.05, growth=4)
    assert next_rate({10.0: True, 30.0: False}, settings) == 20.0
    assert next_rate({10.0: True, 20.0: True, 30.0: False}, settings) == 25.0
    assert next_rate({20.0: True, 20.9: False}, settings) is None  # within 5 % of 20
    assert next_rate({10.0: True, 12.0: False, 30.0: True}, settings) == 11.0  # 30 passing above 12 is noise
    assert next_rate({}, settings) is None


def test_the_next_rate_climbs_past_rates_that_all_meet_the_slo_and_descends_below_rates_that_all_miss():
    settings = SearchSettings(max_probes=4, tolerance=0.05, growth=4)
    assert next_rate({10.0: True, 30.0: True}, settings) == 120.0  # no failing rate: the highest x 4
    assert next_rate({10.0: False, 30.0: False}, settings) == 2.5  # no passing rate: the lowest / 4
    assert next_rate({1024.0: True}, SearchSettings(4, 0.05, growth=3)) == 3070.0  # 3 significant digits


def test_a_search_whose_listed_rates_all_meet_the_slo_climbs_then_brackets_the_capacity():
    """The GPU study's vLLM met the SLO at every listed rate, so a search that only bisected
    added nothing: it climbs until a rate misses, then bisects, within max_probes."""
    capacity = 700.0
    settings = SearchSettings(max_probes=8, tolerance=0.1, growth=4)
    found = search_capacity([4.0, 16.0, 64.0], settings, lambda rate: rate <= capacity)
    assert list(found.outcomes)[3:5] == [256.0, 1020.0]  # 64 x 4, then 256 x 4 (3 digits)
    assert found.converged and found.probes <= settings.max_probes
    assert found.bracket.passing_req_s <= capacity < found.bracket.failing_req_s
    assert found.bracket.failing_req_s - found.bracket.passing_req_s <= 0.1 * found.bracket.passing_req_s
    # and down from rates that all miss it
    low = search_capacity([64.0, 256.0], settings, lambda rate: rate <= 10.0)
    assert list(low.outcomes)[2] == 16.0 and low.converged and low.bracket.passing_req_s <= 10.0


class Interrupted(Exception):
    """A search stopped mid-way, as Ctrl-C would stop it."""


@pytest.mark.integration  # a real server process, timed: never beside the demo sweep
def test_the_search_finds_the_paced_servers_capacity_and_resumes_where_it_stopped(paced_module, tmp_path):
    """Each probe is a load cell's raw file; a search stopped after three measures only the
    rest when run again, and a finished one measures nothing."""
    slo = Slo(ttft_ms=60, tpot_ms=15, percentile=90, attainment=0.9)
    settings = SearchSettings(max_probes=5, tolerance=0.05, growth=4)
    measured: list[float] = []

    def search(server, stop_after: int | None = None) -> Search:
        def outcome(rate: float) -> bool:
            raw = tmp_path / f"code_{REGULAR.name}_r{rate:g}.json"

            def measure() -> None:
                if stop_after is not None and len(measured) == stop_after:
                    raise Interrupted
                requests = 96
                run = open_loop(server.base_url, REGULAR, rate, requests, tokens=TOKENS)
                found = load.level_result(
                    config="paced",
                    prompt_class="code",
                    schedule=schedule(REGULAR, rate, requests, seed=0),
                    settings=load.LoadLevelSettings(
                        requests, TOKENS, 0, 0, True, {}, "Write a story.", REGULAR, 0
                    ),
                    run=run,
                )
                raw.write_text(json.dumps(codec.to_json(found)))
                measured.append(rate)

            return probe_outcome(raw, slo, measure)

        return search_capacity((10.0, 30.0), settings, outcome)

    with paced_module.PacedServer(TTFT_MS, GAP_MS, TOKENS, processes=1, slots=SLOTS) as server:
        with pytest.raises(Interrupted):
            search(server, stop_after=3)
        assert len(measured) == 3
        found = search(server)
        assert search(server).outcomes == found.outcomes  # all read back: nothing measured
    assert sorted(measured) == sorted(found.outcomes)  # each probe measured once, over both runs
    assert found.probes <= settings.max_probes
    capacity, failing = found.bracket.passing_req_s, found.bracket.failing_req_s
    assert capacity is not None and failing is not None, found
    assert capacity == pytest.approx(CAPACITY_REQ_S, rel=0.10), found
    assert failing - capacity <= 0.1 * capacity, found


@pytest.mark.integration
def test_load_search_runs_its_probes_through_the_cell_runner_and_a_rerun_reads_them(workdir, demo_config):
    """On the CPU engine: 1 req/s meets the SLO, 256 req/s of one-slot 64-token answers queue
    past it, and the search's probe between them is an ordinary load cell. Whether the probe
    meets the SLO depends on the host's speed: the search must report what its cell measured."""
    demo_config["configs"] = {"D_q8_0_n0": demo_config["configs"]["D_q8_0_n0"]}
    demo_config["depths"] = []
    del demo_config["natural"]
    demo_config["load"] = {
        "prompt_classes": ["code"],
        "rates": [1, 256],  # 256: all 12 queue at once, p90 TTFT 3 to 8 times the SLO (2 cores)
        "requests": 12,
        "max_tokens": 64,
        "warmup": 1,
        "slo": {"ttft_ms": 100},
        "search": {"max_probes": 1},
    }
    write_config(workdir / "grid.yaml", demo_config)
    first = gridbench("load-search", "--configfile", "grid.yaml", cwd=workdir, check=False)
    assert first.returncode == 0, first.stdout + first.stderr + sweep_logs(workdir)
    # the probe, 1 and 256 bisected to 3 digits: a load cell with raw file and provenance like the listed ones
    cells = {p.name for p in workdir.glob("results/load/D_q8_0_n0/*.json")}
    assert cells == {
        f"code_poisson_r{r}{suffix}" for r in (1, 256, 128) for suffix in (".json", ".provenance.json")
    }

    # the dataset holds the added rate beside the listed ones, and the search's bracket is theirs
    frame = pd.read_csv(workdir / "dataset/load.csv")
    assert sorted(frame["rate_req_s"]) == [1, 128, 256] and set(frame["status"]) == {"ok"}
    slo_met = dict(zip(frame["rate_req_s"], frame["slo_met"], strict=True))
    assert slo_met[1] and not slo_met[256], frame.to_string()
    passing, failing = (128, 256) if slo_met[128] else (1, 128)
    (found,) = [line for line in first.stdout.splitlines() if line.startswith("capacity search:")]
    assert found == (
        f"capacity search: D_q8_0_n0 code poisson: meets the SLO at {passing:g} req/s, "
        f"misses it at {failing:g} req/s after 1 added rates (not converged)"
    ), first.stdout

    measured_at = {p: p.stat().st_mtime_ns for p in workdir.glob("results/load/*/*.json")}
    again = gridbench("load-search", "--configfile", "grid.yaml", cwd=workdir)
    assert found in again.stdout.splitlines()  # the same search, read from its cells
    assert "engine started" not in again.stdout
    assert {p: p.stat().st_mtime_ns for p in workdir.glob("results/load/*/*.json")} == measured_at
