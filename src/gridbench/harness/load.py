"""The open-loop load harness: each request sent at its scheduled time, whether or not the
earlier ones have ended, through the natural harness's streaming client.

An asyncio loop sends the schedule: a few milliseconds before a request is due it starts
the request as a task of its own, which opens its connection and then waits for the due
time before the request goes out (natural.stream_request's ``due_ns``), so neither a late
timer nor opening a connection delays it. A request's send time is when its body went out
(the natural harness's clock), so its lag behind the schedule is what the server saw of the
client; benchmarks/load_schedule.py measures it. While the schedule runs, what the process
held before it is frozen out of the garbage collector's reach: a full collection of a cell
process's heap takes about 10 ms (measured there).

The same loop reads every streamed chunk, and an engine that decodes a batch writes a chunk
to every stream at once: a due time that falls in such a burst waits for the loop to read
it. On the H100 a single loop's lag p99 grew with the rate (vLLM: 0.8 ms at 4 req/s, 2 ms at
64, 27 ms at 256). So a level's schedule can be dealt across several processes
(``load.sending.processes``), one loop each, every one sending every n-th request and
reading only those streams; the processes share the schedule's origin on the system-wide
monotonic clock.

A saturated engine can make a request late too: once its accept backlog is full, the kernel
drops a connection attempt, and the client's kernel resends it a second later. Each request
records how much of its lag that wait took (``accept_wait_ms``), so the client's own lag is
told apart from the server's.

A level far past the engine's capacity queues without bound: with ``saturation_wait_s``, it
ends early once a request has waited that long past its due time for its first token. The
requests in flight are stopped and the rest not sent, each recorded as such, so the level's
result says it saturated and when, rather than waiting out every request's timeout."""

from __future__ import annotations

import asyncio
import gc
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from gridbench.harness import goodput, natural, stats
from gridbench.harness.arrivals import AUTO_PROCESSES, Arrival, Schedule
from gridbench.harness.stats import ERRORED, NOT_SENT_EARLY, RequestTrace
from gridbench.util.files import JsonObject

SCHEMA = "gridbench.load.v1"
LOAD_GENERATOR = "gridbench-load"
# the schedule's origin lies this far after the loop starts: the first request is not late
# for the session's set-up
_START_DELAY_NS = 20_000_000
# a request's task starts this long before it is due, to open its connection by then
_CONNECT_LEAD_NS = 5_000_000
# Linux's initial retransmission timeout (TCP_TIMEOUT_INIT): a dropped connection attempt is
# resent no sooner
_SYN_RETRANSMIT_NS = 1_000_000_000
# how often a loop looks for a request waiting too long for its first token
_SATURATION_POLL_S = 0.05
# the rate one loop sends within 1 ms at p99 while reading its streams (H100, vLLM; module
# docstring): "auto" deals a level's schedule across one process per as many req/s
RATE_PER_PROCESS = 8.0


def load_processes(setting: int | str, rate_req_s: float, requests: int, cpus: int | None) -> int:
    """Processes for a cell: ``load.processes`` as set, or "auto": one per RATE_PER_PROCESS
    req/s, at most half the CPUs (the engine's server may share the host). Never more
    processes than requests."""
    if setting == AUTO_PROCESSES:
        wanted = min(math.ceil(rate_req_s / RATE_PER_PROCESS), (cpus or 1) // 2)
    else:
        wanted = int(setting)
    return max(1, min(wanted, requests))


@dataclass(frozen=True)
class OpenLoopRun:
    """What the client saw: the schedule's origin and every request's trace, in index order."""

    origin_ns: int
    due_ns: tuple[int, ...]  # each request's due time, by position
    traces: tuple[RequestTrace, ...]


def run_open_loop(
    endpoint: natural.Endpoint,
    requests: Sequence[natural.ChatRequest],
    offsets_s: Sequence[float],
    timeout_s: float,
    on_finished: Callable[[RequestTrace], None] = lambda _trace: None,
    processes: int = 1,
    saturation_wait_s: float | None = None,
) -> OpenLoopRun:
    """Send ``requests[k]`` at ``offsets_s[k]`` after the origin, never waiting for another,
    from ``processes`` loops, each sending every ``processes``-th request of the schedule.
    With ``saturation_wait_s``, the level ends early once a request has waited that long past
    its due time for its first token: the requests in flight are stopped, the rest not sent."""
    if processes <= 1:
        return asyncio.run(
            send_open_loop(endpoint, requests, offsets_s, timeout_s, on_finished, saturation_wait_s)
        )
    origin = natural.SPAWN.Value("q", 0)
    stop = natural.SPAWN.Event()  # any process's level saturating ends every process's

    def set_origin() -> None:  # every loop is up, its session open: the schedule starts
        origin.value = time.perf_counter_ns() + _START_DELAY_NS

    n = processes
    saturation = (saturation_wait_s, stop)
    shares = [(endpoint, requests[k::n], offsets_s[k::n], timeout_s, origin, saturation) for k in range(n)]
    traces = natural.run_in_processes(_open_loop_worker, shares, len(requests), on_finished, set_origin)
    return OpenLoopRun(origin.value, _due(origin.value, offsets_s), tuple(traces))


async def send_open_loop(
    endpoint: natural.Endpoint,
    requests: Sequence[natural.ChatRequest],
    offsets_s: Sequence[float],
    timeout_s: float,
    on_finished: Callable[[RequestTrace], None] = lambda _trace: None,
    saturation_wait_s: float | None = None,
) -> OpenLoopRun:
    """``run_open_loop`` in the running loop, alone."""
    saturation = _Saturation(saturation_wait_s, threading.Event())
    with _collector_on_new_objects_only():
        async with natural.client_session() as session:
            origin_ns = time.perf_counter_ns() + _START_DELAY_NS
            due = _due(origin_ns, offsets_s)
            traces = await _send(session, endpoint, requests, due, timeout_s, on_finished, saturation)
    return OpenLoopRun(origin_ns, due, traces)


def _due(origin_ns: int, offsets_s: Sequence[float]) -> tuple[int, ...]:
    return tuple(origin_ns + round(offset * 1e9) for offset in offsets_s)


class _Saturation:
    """Whether a loop's level has ended early: once a request it sent has waited ``wait_s``
    past its due time for its first token (the engine is not keeping up with the rate, and
    whatever is still scheduled would only queue behind), or another process's level did
    (``stop``, an event the processes share)."""

    def __init__(self, wait_s: float | None, stop: Any) -> None:
        self.wait_ns = None if wait_s is None else round(wait_s * 1e9)
        self.stop = stop
        self.waiting: dict[int, int] = {}  # a request's index -> its due time, until its first token
        self.tasks: list[asyncio.Task[RequestTrace]] = []

    def first_token(self, index: int) -> None:
        self.waiting.pop(index, None)

    async def watch(self) -> None:
        """Set ``stop`` when the level saturates, or see it set; then stop the requests in flight.
        Without a wait no process of the level sets it: nothing to watch."""
        if self.wait_ns is None:
            return
        while not self.stop.is_set():
            await asyncio.sleep(_SATURATION_POLL_S)
            if self.waiting:
                waited_ns = time.perf_counter_ns() - min(self.waiting.values())
                if waited_ns > self.wait_ns:
                    self.stop.set()
        for task in self.tasks:
            task.cancel()


async def _send(
    session: aiohttp.ClientSession,
    endpoint: natural.Endpoint,
    requests: Sequence[natural.ChatRequest],
    due: Sequence[int],
    timeout_s: float,
    on_finished: Callable[[RequestTrace], None],
    saturation: _Saturation,
) -> tuple[RequestTrace, ...]:
    async def one(request: natural.ChatRequest, due_ns: int) -> RequestTrace:
        saturation.waiting[request.index] = due_ns
        try:
            trace = await natural.stream_request(
                session,
                endpoint,
                request,
                timeout_s,
                due_ns,
                on_first_token=lambda: saturation.first_token(request.index),
                stop=saturation.stop,
            )
        finally:
            saturation.first_token(request.index)  # or none: it waits no more
        on_finished(trace)
        return trace

    watchdog = asyncio.create_task(saturation.watch())
    for request, due_ns in zip(requests, due, strict=True):
        await natural.wait_until(due_ns - _CONNECT_LEAD_NS)
        if saturation.stop.is_set():
            break
        saturation.tasks.append(asyncio.create_task(one(request, due_ns)))
    # a task stopped before it ran never started its request
    outcomes = await asyncio.gather(*saturation.tasks, return_exceptions=True)
    watchdog.cancel()
    traces = []
    never_started = [None] * (len(requests) - len(outcomes))
    for request, outcome in zip(requests, [*outcomes, *never_started], strict=True):
        if isinstance(outcome, RequestTrace):
            traces.append(outcome)
            continue
        if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError):
            raise outcome
        now_ns = time.perf_counter_ns()
        unsent = RequestTrace(request.index, ERRORED, now_ns, now_ns, error=NOT_SENT_EARLY, sent=False)
        on_finished(unsent)
        traces.append(unsent)
    return tuple(traces)


def _open_loop_worker(
    endpoint: natural.Endpoint,
    requests: Sequence[natural.ChatRequest],
    offsets_s: Sequence[float],
    timeout_s: float,
    origin: Any,
    saturation: tuple[float | None, Any],
    finished: Any,
    go: Any,
) -> None:
    """One process's share of the schedule (natural.run_in_processes's target): its loop and
    session set up, it says it is ready, then sends its requests once the origin is set."""

    async def run() -> None:
        with _collector_on_new_objects_only():
            async with natural.client_session() as session:
                finished.put("ready")
                await asyncio.to_thread(go.wait)
                due = _due(origin.value, offsets_s)
                watch = _Saturation(*saturation)
                await _send(session, endpoint, requests, due, timeout_s, finished.put, watch)

    asyncio.run(run())
    finished.close()
    finished.join_thread()  # every trace is in the pipe before the process exits


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
            lag_ms=round((trace.start_ns - due_ns) / 1e6, 4) if trace.sent else None,
            # a record's index is its position in the schedule, as the natural harness numbers them
            record=replace(stats.request_record(trace, run.origin_ns), index=position),
            accept_wait_ms=_accept_wait_ms(trace, due_ns),
        )
        for position, (trace, due_ns) in enumerate(ordered)
    )


def _accept_wait_ms(trace: RequestTrace, due_ns: int) -> float | None:
    """How long past its due time the request's connection opened, where opening it took TCP's
    initial retransmission timeout or longer: the server's full accept backlog dropped the first
    attempt. A shorter open cannot be the server's (the kernel completes a handshake whether
    or not the server has accepted), so its lateness, if any, is the client's: 0."""
    if not trace.sent or trace.connecting_ns is None or trace.connected_ns is None:
        return None
    if trace.connected_ns - trace.connecting_ns < _SYN_RETRANSMIT_NS:
        return 0.0
    return round(max(0, trace.connected_ns - due_ns) / 1e6, 4)


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
