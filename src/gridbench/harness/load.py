"""The open-loop load harness: each request sent at its scheduled time, whether or not the
earlier ones have ended, through the natural harness's streaming client.

One asyncio loop sends the schedule: a few milliseconds before a request is due it starts
the request as a task of its own, which opens its connection and then waits for the due
time before the request goes out (natural.stream_request's ``due_ns``), so neither a late
timer nor opening a connection delays it. A request's send time is when its body went out
(the natural harness's clock), so its lag behind the schedule is what the server saw of the
client; benchmarks/load_schedule.py measures it. While the schedule runs, what the process
held before it is frozen out of the garbage collector's reach: a full collection of a cell
process's heap takes about 10 ms (measured there), and on the H100 one request in two saturated
cells went out 12–14 ms late, the rest within about 1 ms.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

from gridbench.harness import goodput, natural, stats
from gridbench.harness.arrivals import Arrival, Schedule
from gridbench.harness.stats import RequestTrace
from gridbench.util.files import JsonObject

SCHEMA = "gridbench.load.v1"
LOAD_GENERATOR = "gridbench-load"
# the schedule's origin lies this far after the loop starts: the first request is not late
# for the session's set-up
_START_DELAY_NS = 20_000_000
# a request's task starts this long before it is due, to open its connection by then
_CONNECT_LEAD_NS = 5_000_000


@dataclass(frozen=True)
class OpenLoopRun:
    """What the client saw: the schedule's origin and every request's trace, in index order."""

    origin_ns: int
    due_ns: tuple[int, ...]  # each request's due time, by position
    traces: tuple[RequestTrace, ...]


async def send_open_loop(
    endpoint: natural.Endpoint,
    requests: Sequence[natural.ChatRequest],
    offsets_s: Sequence[float],
    timeout_s: float,
    on_finished: Callable[[RequestTrace], None] = lambda _trace: None,
) -> OpenLoopRun:
    """Send ``requests[k]`` at ``offsets_s[k]`` after the origin, never waiting for another."""

    async def one(request: natural.ChatRequest, due_ns: int) -> RequestTrace:
        trace = await natural.stream_request(session, endpoint, request, timeout_s, due_ns)
        on_finished(trace)
        return trace

    with _collector_on_new_objects_only():
        async with natural.client_session() as session:
            origin_ns = time.perf_counter_ns() + _START_DELAY_NS
            due = tuple(origin_ns + round(offset * 1e9) for offset in offsets_s)
            tasks = []
            for request, due_ns in zip(requests, due, strict=True):
                await natural.wait_until(due_ns - _CONNECT_LEAD_NS)
                tasks.append(asyncio.create_task(one(request, due_ns)))
            traces = await asyncio.gather(*tasks)
    return OpenLoopRun(origin_ns, due, tuple(traces))


@contextmanager
def _collector_on_new_objects_only() -> Iterator[None]:
    """Every object alive now in the permanent generation until the block ends: a collection
    in the block then scans only what the block allocated, which takes well under a
    millisecond."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@dataclass(frozen=True)
class LoadLevelSettings:
    """What a load cell sent, as its result file's ``settings`` record it."""

    requests: int
    max_tokens: int
    temperature: float
    warmup: int
    cache_bust: bool
    extra_body: JsonObject
    prompt: str
    arrival: Arrival
    seed: int

    @classmethod
    def of(cls, plan: natural.LevelPlan, arrival: Arrival, seed: int) -> LoadLevelSettings:
        return cls(
            requests=plan.requests,
            max_tokens=plan.max_tokens,
            temperature=plan.temperature,
            warmup=plan.warmup,
            cache_bust=plan.cache_bust,
            extra_body=plan.extra_body,
            prompt=plan.prompt,
            arrival=arrival,
            seed=seed,
        )


@dataclass(frozen=True, kw_only=True)
class LoadResult:
    """One load cell's raw result file (schema gridbench.load.v1): what it sent, every
    request with its due time and lag, and their summary (the SLO is the dataset's to judge)."""

    schema: str = SCHEMA
    config: str
    prompt_class: str
    arrival: str  # the coordinate: Arrival.name
    rate_req_s: float
    settings: LoadLevelSettings
    requests: tuple[goodput.LoadRequest, ...]  # in schedule order, numbered from 0
    summary: goodput.LoadSummary


def load_requests(run: OpenLoopRun) -> tuple[goodput.LoadRequest, ...]:
    """Each request's record, timed from the schedule's origin, with its lag."""
    ordered = sorted(zip(run.traces, run.due_ns, strict=True), key=lambda pair: pair[0].index)
    return tuple(
        goodput.LoadRequest(
            scheduled_s=round((due_ns - run.origin_ns) / 1e9, 6),
            lag_ms=round((trace.start_ns - due_ns) / 1e6, 4),
            # a record's index is its position in the schedule, as the natural harness numbers them
            record=replace(stats.request_record(trace, run.origin_ns), index=position),
        )
        for position, (trace, due_ns) in enumerate(ordered)
    )


def level_result(
    *, config: str, prompt_class: str, schedule: Schedule, settings: LoadLevelSettings, run: OpenLoopRun
) -> LoadResult:
    """The cell's records and summary from what the client saw."""
    requests = load_requests(run)
    return LoadResult(
        config=config,
        prompt_class=prompt_class,
        arrival=schedule.arrival.name,
        rate_req_s=schedule.rate_req_s,
        settings=settings,
        requests=requests,
        summary=goodput.summarize(requests, schedule.rate_req_s),
    )
