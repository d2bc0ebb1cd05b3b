"""The natural-prompt harness: streamed /v1/chat/completions at a fixed concurrency.

One cell is one prompt class at one concurrency: a few serial warm-up requests (not
counted), then ``requests`` measured requests with at most ``concurrency`` in flight. A
request's clock starts when it is sent and every chunk is timestamped (``perf_counter_ns``)
the moment it is read off the socket; a request that fails is recorded with its reason,
never dropped. benchmarks/harness_fidelity.py measures how exact this is.

llama.cpp's server closes the connection after each streamed response, so every request
opens its own connection (``force_close``): a reused kept-alive connection would race it.

One asyncio loop costs some µs of CPU per streamed token, so a level with many requests in
flight runs across several processes, one loop each (``LevelPlan.processes``). The level's
``concurrency`` is then split into fixed slots per process, and every slot, when free, takes
the next request from one shared counter: exactly ``concurrency`` requests are in flight
until the requests run out, and they are issued in index order as slots free up, as the
single loop's FIFO semaphore issues them. (Dealing each process its requests up front
would leave a process's slots idle while another still has requests queued.) The processes
read the same clock (``perf_counter_ns`` is CLOCK_MONOTONIC on Linux, system-wide), send
each finished request back as it ends, and the level's traces are merged by index: the
records are the ones a single loop writes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import os
import queue
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from gridbench.engines.spec_metrics import Acceptance
from gridbench.harness import stats
from gridbench.harness.arrivals import AUTO_PROCESSES
from gridbench.harness.prompts import NaturalSettings
from gridbench.harness.sse import SSEEvent, SSEParser, parse_chunk, plain_delta_has_text
from gridbench.harness.stats import (
    ERRORED,
    INCOMPLETE,
    OK,
    STOPPED_EARLY,
    LevelSummary,
    RequestRecord,
    RequestTrace,
)
from gridbench.util import codec
from gridbench.util.files import JsonObject

log = logging.getLogger(__name__)

SCHEMA = "gridbench.natural.v1"
LOAD_GENERATOR = "gridbench-natural"
WARMUP_MAX_TOKENS = 128  # as AEON's bench_natural.py: warm-up compiles and autotunes, no need for more
# requests in flight one loop holds within 1 % of the truth (benchmarks/harness_fidelity.py)
REQUESTS_PER_PROCESS = 64
_ERROR_BODY_CHARS = 300
_WORKER_POLL_S = 1.0
# harness processes are spawned, not forked: the caller may hold threads (a fork copies their
# locks mid-use)
SPAWN = multiprocessing.get_context("spawn")
# asyncio's timers wake up to a millisecond late (epoll counts in milliseconds): the last
# stretch before a due time is spent yielding to the loop instead
_SPIN_NS = 1_000_000


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    model: str
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"{self.base_url}/v1/chat/completions"


@dataclass(frozen=True)
class LevelPlan:
    """What one cell sends: the prompt, how many requests, how they are shaped."""

    prompt: str
    concurrency: int
    requests: int
    warmup: int
    max_tokens: int
    temperature: float
    cache_bust: bool
    extra_body: JsonObject
    request_timeout_s: float
    processes: int = 1  # harness processes the measured requests run across

    def request(self, index: int, max_tokens: int | None = None) -> ChatRequest:
        """Request ``index`` (warm-ups come first, so no measured request repeats one)."""
        text = f"[bench-{index}] {self.prompt}" if self.cache_bust else self.prompt
        return ChatRequest(index, text, max_tokens or self.max_tokens, self.temperature, self.extra_body)


@dataclass(frozen=True)
class ChatMessage:
    """One message of a conversation's history, as a chat request resends it."""

    role: str  # "user" or "assistant"
    content: str


@dataclass(frozen=True)
class ChatRequest:
    """One streamed chat-completions request of a level: ``text`` is the user's last
    message, after the ``history`` of a conversation (a session cell's later turns)."""

    index: int
    text: str
    max_tokens: int
    temperature: float
    extra_body: JsonObject  # the config's: it may set any key but the streaming ones
    history: tuple[ChatMessage, ...] = ()
    # keep the answer's text in the trace (a session resends it); off, a plain delta is not parsed
    keep_answer: bool = False

    def payload(self, model: str) -> JsonObject:
        """The request's JSON body, as the endpoint is sent it."""
        earlier = [{"role": m.role, "content": m.content} for m in self.history]
        return {
            "model": model,
            "messages": [*earlier, {"role": "user", "content": self.text}],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            **self.extra_body,
            "stream": True,
            "stream_options": {"include_usage": True},
        }


def harness_processes(setting: int | str, concurrency: int, cpus: int | None) -> int:
    """Processes for a level: ``natural.processes`` as set, or "auto": one loop up to
    REQUESTS_PER_PROCESS requests in flight, one more per as many again, at most one per CPU.
    Never more processes than requests in flight (each needs a slot)."""
    if setting == AUTO_PROCESSES:
        wanted = -(-concurrency // REQUESTS_PER_PROCESS)
        return max(1, min(wanted, cpus or 1))
    return max(1, min(int(setting), concurrency))


def level_plan(settings: NaturalSettings, prompt: str, concurrency: int) -> LevelPlan:
    return LevelPlan(
        prompt=prompt,
        concurrency=concurrency,
        requests=settings.requests,
        warmup=settings.warmup,
        max_tokens=settings.max_tokens,
        temperature=settings.temperature,
        cache_bust=settings.cache_bust,
        extra_body=settings.extra_body,
        request_timeout_s=settings.request_timeout_s,
        processes=harness_processes(settings.processes, concurrency, os.cpu_count()),
    )


async def stream_request(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    request: ChatRequest,
    timeout_s: float,
    due_ns: int | None = None,
    on_first_token: Callable[[], None] | None = None,
    stop: Any = None,
) -> RequestTrace:
    """One streamed request, timed chunk by chunk; failures become a trace, never an exception.
    With ``due_ns`` (an open loop's), its connection opens at once and the request goes out
    on it at that time. ``on_first_token`` is called when its first text arrives. Cancelled
    once ``stop`` (an event) is set, it ends as a trace that says so."""
    payload = request.payload(endpoint.model)
    # "connecting_ns" and "connected_ns" are set when its own, fresh connection starts to open
    # and has opened, "ns" when the request goes out on it
    sent: dict[str, int | None] = {"ns": None, "due_ns": due_ns, "connecting_ns": None, "connected_ns": None}
    stream = _Stream(
        issued_ns=time.perf_counter_ns(), keeps_answer=request.keep_answer, on_first_text=on_first_token
    )

    def trace(status: str, error: str | None = None) -> RequestTrace:
        return stream.trace(request.index, sent, status, error)

    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(
                endpoint.url, json=payload, headers=endpoint.headers, trace_request_ctx=sent
            ) as response:
                if error := await _receive(response, stream):
                    return trace(ERRORED, error)
    except TimeoutError:
        stream.end_ns = time.perf_counter_ns()
        return trace(ERRORED, f"no complete response within {timeout_s:g} s (natural.request_timeout_s)")
    except asyncio.CancelledError:
        if stop is None or not stop.is_set():
            raise
        stream.end_ns = time.perf_counter_ns()
        return trace(INCOMPLETE if stream.responded else ERRORED, STOPPED_EARLY)
    except (aiohttp.ClientError, OSError) as err:
        stream.end_ns = time.perf_counter_ns()
        status = INCOMPLETE if stream.responded else ERRORED
        what = "stream broke" if stream.responded else "request failed"
        return trace(status, f"{what}: {type(err).__name__}: {err}")
    if not stream.done:
        return trace(INCOMPLETE, f"stream ended without [DONE] after {len(stream.text_ns)} text chunks")
    if stream.tokens is None:
        return trace(INCOMPLETE, "stream had no usage block (stream_options.include_usage ignored)")
    return trace(OK)


async def _receive(response: aiohttp.ClientResponse, stream: _Stream) -> str | None:
    """Read the response into ``stream``, timing each read; the error that ended it, if any."""
    if response.status != 200:
        detail = (await response.text(errors="replace"))[:_ERROR_BODY_CHARS]
        stream.end_ns = time.perf_counter_ns()
        return f"HTTP {response.status}: {detail.strip()}"
    stream.responded = True
    parser = SSEParser()
    async for data in response.content.iter_any():
        stream.end_ns = time.perf_counter_ns()
        if error := stream.read(parser.feed(data)):
            return f"error in stream: {error}"
    if error := stream.read_last(parser.finish()):
        return f"error in stream: {error}"
    return None


@dataclass
class _Stream:
    """What one streamed request has received so far, on the ``perf_counter_ns`` clock."""

    issued_ns: int
    keeps_answer: bool = False
    on_first_text: Callable[[], None] | None = None
    end_ns: int = field(init=False)
    text_ns: list[int] = field(default_factory=list)
    answer: list[str] = field(default_factory=list)  # the text chunks, when it keeps the answer
    counts: tuple[tuple[str, int], ...] = ()  # the usage chunk's integers (sse.StreamChunk.counts)
    tokens: int | None = None
    finish_reason: str | None = None
    done: bool = False
    responded: bool = False

    def __post_init__(self) -> None:
        self.end_ns = self.issued_ns

    def read(self, events: Sequence[SSEEvent]) -> str | None:
        """Take in the events of the read that ended at ``end_ns``; the error one reports."""
        for event in events:
            plain = None if self.keeps_answer else plain_delta_has_text(event)
            if plain is not None:  # a token's chunk: only its arrival matters
                if plain:
                    self._text_arrived()
                continue
            chunk = parse_chunk(event)
            if chunk.error:
                return chunk.error
            if chunk.done:
                self.done = True
            if chunk.has_text:
                self._text_arrived()
                if self.keeps_answer:
                    self.answer.append(chunk.text)
            self.counts = chunk.counts or self.counts
            self.finish_reason = chunk.finish_reason or self.finish_reason
            if chunk.completion_tokens is not None:
                self.tokens = chunk.completion_tokens
        return None

    def _text_arrived(self) -> None:
        if not self.text_ns and self.on_first_text is not None:
            self.on_first_text()
        self.text_ns.append(self.end_ns)

    def read_last(self, events: Sequence[SSEEvent]) -> str | None:
        """Take in the events left when the stream closed: only an error or [DONE] counts."""
        for event in events:
            chunk = parse_chunk(event)
            if chunk.error:
                return chunk.error
            self.done = self.done or chunk.done
        return None

    def trace(
        self, index: int, sent: Mapping[str, int | None], status: str, error: str | None
    ) -> RequestTrace:
        """The trace, timed by ``sent`` (when the request went out and its connection opened)."""
        return RequestTrace(
            index=index,
            status=status,
            start_ns=sent["ns"] or self.issued_ns,
            connecting_ns=sent["connecting_ns"],
            connected_ns=sent["connected_ns"],
            sent=sent["ns"] is not None,
            end_ns=self.end_ns,
            text_chunk_ns=tuple(self.text_ns),
            output_tokens=self.tokens,
            finish_reason=self.finish_reason,
            error=error,
            answer="".join(self.answer) if self.keeps_answer else None,
            counts=self.counts,
        )


async def _on_request_sent(_session: Any, context: Any, _params: Any) -> None:  # aiohttp's trace hook
    # aiohttp holds the headers back and writes them with the body, from a task of its own:
    # the clock starts as the body is written, not when the headers were only buffered
    context.trace_request_ctx["ns"] = time.perf_counter_ns()


async def wait_until(due_ns: int) -> None:
    """Return at ``due_ns`` (perf_counter_ns), other tasks running meanwhile."""
    ahead_ns = due_ns - time.perf_counter_ns() - _SPIN_NS
    if ahead_ns > 0:
        await asyncio.sleep(ahead_ns / 1e9)
    # no event to wait on: a timer is what wakes late, so the loop is yielded to until due
    while time.perf_counter_ns() < due_ns:  # noqa: ASYNC110
        await asyncio.sleep(0)


async def _on_connection_creating(_session: Any, context: Any, _params: Any) -> None:  # aiohttp's hook
    context.trace_request_ctx["connecting_ns"] = time.perf_counter_ns()


async def _on_connection_created(_session: Any, context: Any, _params: Any) -> None:  # aiohttp's hook
    # an open loop's request waits here, its connection open, so opening it costs no lag
    context.trace_request_ctx["connected_ns"] = time.perf_counter_ns()
    due_ns = context.trace_request_ctx["due_ns"]
    if due_ns is not None:
        await wait_until(due_ns)


def client_session() -> aiohttp.ClientSession:
    """A fresh connection per request (see the module docstring), no pool limit (the
    semaphore is the limit), and a request's clock starting when it is sent: opening its
    connection is the harness's cost, not the server's."""
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    tracing = aiohttp.TraceConfig()
    tracing.on_request_chunk_sent.append(_on_request_sent)
    tracing.on_connection_create_start.append(_on_connection_creating)
    tracing.on_connection_create_end.append(_on_connection_created)
    return aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=None), trace_configs=[tracing]
    )


@dataclass(frozen=True)
class ProgressLine:
    """One line of a natural cell's progress file (``progress_file``), written when a request
    of the phase ended, and read back by ``gridbench progress``."""

    phase: str  # "measured", or "warm-up"
    done: int  # the phase's requests ended so far
    total: int  # the phase's requests
    status: str  # the request's: "ok", or how it failed
    output_tokens: int  # of the phase's ok requests so far
    elapsed_s: float  # since the phase began


@contextmanager
def progress_file(path: Path | None, phase: str, total: int) -> Iterator[Callable[[RequestTrace], None]]:
    """A callback that appends one JSON line per finished request to ``path`` (none when
    None): what ``gridbench progress`` shows of a running cell. A line is a few dozen
    bytes written after the request's clock stopped, so it costs the measurement nothing."""
    if path is None:
        yield lambda _trace: None
        return
    started = time.monotonic()
    done = output_tokens = 0
    with path.open("a", buffering=1) as f:  # line-buffered: each line is on disk at once

        def finished(trace: RequestTrace) -> None:
            nonlocal done, output_tokens
            done += 1
            if trace.status == OK:  # as the summary's output_tok_s counts them
                output_tokens += trace.output_tokens or 0
            elapsed_s = round(time.monotonic() - started, 3)
            line = ProgressLine(phase, done, total, trace.status, output_tokens, elapsed_s)
            f.write(json.dumps(codec.to_json(line)) + "\n")

        yield finished


async def run_requests(
    endpoint: Endpoint,
    requests: Sequence[ChatRequest],
    concurrency: int,
    timeout_s: float,
    on_finished: Callable[[RequestTrace], None] = lambda _trace: None,
) -> list[RequestTrace]:
    """Send ``requests`` with at most ``concurrency`` in flight, in issue order (FIFO)."""
    gate = asyncio.Semaphore(concurrency)
    total = len(requests)
    finished = 0

    async def one(request: ChatRequest) -> RequestTrace:
        nonlocal finished
        async with gate:
            result = await stream_request(session, endpoint, request, timeout_s)
        finished += 1
        log.debug(f"request {finished}/{total} (#{request.index}): {result.status} {result.error or ''}")
        on_finished(result)
        return result

    async with client_session() as session:
        return list(await asyncio.gather(*(one(request) for request in requests)))


def warm_up(endpoint: Endpoint, plan: LevelPlan, progress: Path | None = None) -> list[RequestTrace]:
    """The serial warm-up requests; their outcome is reported, not counted."""
    requests = [plan.request(i, min(WARMUP_MAX_TOKENS, plan.max_tokens)) for i in range(plan.warmup)]
    if not requests:
        return []
    with progress_file(progress, "warm-up", len(requests)) as on_finished:
        return asyncio.run(run_requests(endpoint, requests, 1, plan.request_timeout_s, on_finished))


def measure_level(endpoint: Endpoint, plan: LevelPlan, progress: Path | None = None) -> list[RequestTrace]:
    """The measured requests, numbered after the warm-ups, in index order."""
    with progress_file(progress, "measured", plan.requests) as on_finished:
        if plan.processes > 1:
            return run_across_processes(endpoint, plan, on_finished)
        requests = [plan.request(plan.warmup + i) for i in range(plan.requests)]
        return asyncio.run(
            run_requests(endpoint, requests, plan.concurrency, plan.request_timeout_s, on_finished)
        )


def process_slots(concurrency: int, processes: int) -> list[int]:
    """The level's ``concurrency`` as slots per process, as even as it divides."""
    share, extra = divmod(concurrency, processes)
    return [share + (k < extra) for k in range(processes)]


def run_across_processes(
    endpoint: Endpoint, plan: LevelPlan, on_finished: Callable[[RequestTrace], None]
) -> list[RequestTrace]:
    """The measured requests across ``plan.processes`` worker processes (the module
    docstring says how concurrency is held); each trace comes back as its request ends."""
    next_request = SPAWN.Value("q", 0)  # the shared counter, with its lock
    slots = process_slots(plan.concurrency, plan.processes)
    shares = [(endpoint, plan, share, next_request) for share in slots]
    return run_in_processes(_worker, shares, plan.requests, on_finished)


def run_in_processes(
    target: Callable[..., None],
    shares: Sequence[tuple[Any, ...]],
    expected: int,
    on_finished: Callable[[RequestTrace], None],
    before_go: Callable[[], None] = lambda: None,
) -> list[RequestTrace]:
    """``target(*share, finished, go)`` in a process per share. Each puts "ready" on
    ``finished`` and then waits for ``go``, which is set (after ``before_go``) once all are
    ready; then each puts its traces as its requests end. The ``expected`` traces, by index."""
    finished = SPAWN.Queue()
    go = SPAWN.Event()
    workers = [
        SPAWN.Process(target=target, args=(*share, finished, go), name=f"gridbench-harness-{k}", daemon=True)
        for k, share in enumerate(shares)
    ]
    traces: list[RequestTrace] = []
    try:
        for worker in workers:
            worker.start()
        for _ in workers:  # every loop is up before the first request goes out
            _take(finished, workers)
        before_go()
        go.set()
        while len(traces) < expected:
            trace = _take(finished, workers)
            traces.append(trace)
            on_finished(trace)
        for worker in workers:
            worker.join()
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
    return sorted(traces, key=lambda t: t.index)


def _take(finished: Any, workers: list[Any]) -> Any:
    """The next message from the workers; a worker that died makes the level fail."""
    while True:
        try:
            return finished.get(timeout=_WORKER_POLL_S)
        except queue.Empty:
            dead = [w for w in workers if w.exitcode not in (None, 0)]
            if dead:
                codes = ", ".join(f"{w.name} exit {w.exitcode}" for w in dead)
                raise RuntimeError(f"a harness process died mid-level ({codes})") from None


def _worker(
    endpoint: Endpoint, plan: LevelPlan, slots: int, next_request: Any, finished: Any, go: Any
) -> None:
    """One worker process: ``slots`` requests in flight, each slot taking the next index."""
    finished.put("ready")
    go.wait()

    def take_index() -> int | None:
        with next_request.get_lock():  # held for an increment: the loop does not stall
            position = next_request.value
            next_request.value += 1
        return plan.warmup + position if position < plan.requests else None

    async def slot(session: aiohttp.ClientSession) -> None:
        while (index := take_index()) is not None:
            trace = await stream_request(session, endpoint, plan.request(index), plan.request_timeout_s)
            finished.put(trace)

    async def run() -> None:
        async with client_session() as session:
            await asyncio.gather(*(slot(session) for _ in range(slots)))

    asyncio.run(run())
    finished.close()
    finished.join_thread()  # every trace is in the pipe before the process exits


@dataclass(frozen=True)
class LevelSettings:
    """What a level sent, as its result file's ``settings`` record it."""

    requests: int
    max_tokens: int
    temperature: float
    warmup: int
    cache_bust: bool
    extra_body: JsonObject
    prompt: str


@dataclass(frozen=True, kw_only=True)
class LevelResult:
    """One cell's raw result file (schema gridbench.natural.v1): what it sent, every measured
    request, and their summary."""

    schema: str = SCHEMA
    config: str
    prompt_class: str
    concurrency: int
    settings: LevelSettings
    requests: tuple[RequestRecord, ...]  # in issue order, numbered from 0
    summary: LevelSummary
    spec_decode: Acceptance | None

    @classmethod
    def of(
        cls,
        config: str,
        prompt_class: str,
        plan: LevelPlan,
        requests: tuple[RequestRecord, ...],
        summary: LevelSummary,
        spec_decode: Acceptance | None,
    ) -> LevelResult:
        """The result of ``plan``'s requests."""
        settings = LevelSettings(
            requests=plan.requests,
            max_tokens=plan.max_tokens,
            temperature=plan.temperature,
            warmup=plan.warmup,
            cache_bust=plan.cache_bust,
            extra_body=plan.extra_body,
            prompt=plan.prompt,
        )
        return cls(
            config=config,
            prompt_class=prompt_class,
            concurrency=plan.concurrency,
            settings=settings,
            requests=requests,
            summary=summary,
            spec_decode=spec_decode,
        )


def level_result(
    *,
    config: str,
    prompt_class: str,
    plan: LevelPlan,
    traces: Sequence[RequestTrace],
    spec_decode: Acceptance | None,
) -> LevelResult:
    """The level's records and summary from its measured requests' traces."""
    level_start = min(t.start_ns for t in traces)
    ordered = sorted(traces, key=lambda t: t.index)
    # a record's index is its position among the measured requests, in issue order
    records = tuple(
        replace(stats.request_record(t, level_start), index=position) for position, t in enumerate(ordered)
    )
    return LevelResult.of(config, prompt_class, plan, records, stats.summarize(records), spec_decode)
