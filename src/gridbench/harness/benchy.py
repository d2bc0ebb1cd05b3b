"""llama-benchy for one (config, depth) cell: command line, offline set-up, run, checks."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn

from gridbench.config.grid import BenchySettings, ServingConfig
from gridbench.engines.kinds import engine_kind
from gridbench.errors import BenchmarkError, ConfigError, ResultFileError
from gridbench.util import codec
from gridbench.util.files import atomic_write_bytes

log = logging.getLogger(__name__)

BENCHY_HOME = Path(".gridbench/benchy-home")
# its --emit-progress file in the cell's scratch folder, read live by `gridbench progress`
PROGRESS_FILE = "benchy.progress.jsonl"
# Never fetched: llama-benchy reads its cache, keyed by md5 of this URL, before any download.
# a sitecustomize that gives llama-benchy one connection per request (see its docstring)
ONE_CONNECTION_PER_REQUEST_SITE = Path(__file__).with_name("benchy_site")
_UNREACHABLE_BOOK = "http://127.0.0.1:9/gridbench-corpus/{digest}.txt"
# llama-benchy metrics with one value per successful request (runs x concurrency of them).
# Prefill throughput is not among them: llama-benchy leaves it out of a request whose time
# to first response is within the measured latency (tiny prompts), which is not a failure.
PER_REQUEST_METRICS = ("ttfr", "e2e_ttft", "tg_req_throughput")
REQUIRED_METRICS = ("tg_throughput", "e2e_ttft")
# A prefix-cache cell measures the time to first token over a cached context; its decode is
# the cold cell's business (and a cached answer may come in one burst on a loaded machine).
CACHED_PER_REQUEST_METRICS = ("ttfr", "e2e_ttft")
CACHED_REQUIRED_METRICS = ("e2e_ttft",)


@dataclass(frozen=True)
class BenchyRun:
    """A llama-benchy invocation. ``argv`` holds a placeholder where the API key goes: it is
    safe to log and store; ``run`` puts the key from ``api_key_env`` in at the last moment."""

    argv: tuple[str, ...]
    env: dict[str, str]
    result_path: Path
    progress_path: Path
    api_key_env: str | None = None


def benchy_executable() -> str:
    """llama-benchy beside the running interpreter (the venv), else from PATH."""
    local = Path(sys.executable).parent / "llama-benchy"
    return str(local) if local.exists() else "llama-benchy"


def seed_corpus(corpus: Path, home: Path = BENCHY_HOME) -> str:
    """Put the corpus where llama-benchy looks before downloading; returns the book URL."""
    try:
        data = corpus.read_bytes()
    except FileNotFoundError as err:
        raise ConfigError(
            f"benchy.corpus {corpus} does not exist",
            hint="let the workflow generate it (rule make_corpus) or point "
            "benchy.corpus at a local text file",
        ) from err
    url = _UNREACHABLE_BOOK.format(digest=hashlib.sha256(data).hexdigest()[:16])
    cache = home / ".cache/llama-benchy" / (hashlib.md5(url.encode()).hexdigest() + ".txt")
    if not cache.exists():
        atomic_write_bytes(cache, data)
    return url


def build_run(
    cfg: ServingConfig,
    depth: int,
    settings: BenchySettings,
    *,
    base_url: str,
    book_url: str,
    workdir: Path,
    post_run_cmd: str | None = None,
    prefix_cache: bool = False,
) -> BenchyRun:
    tokenizer = cfg.checkpoint.tokenizer
    if not tokenizer:
        raise ConfigError(
            f"checkpoint {cfg.checkpoint.name} (config {cfg.name}) has no tokenizer; "
            "llama-benchy needs a local one and never downloads it",
            hint=f"set checkpoints.{cfg.checkpoint.name}.tokenizer to a tokenizer.json",
        )
    result = workdir / "benchy.json"
    progress = workdir / PROGRESS_FILE
    argv = [
        benchy_executable(),
        *_request_options(cfg, depth, settings, base_url=base_url, book_url=book_url, tokenizer=tokenizer),
        *_switches(settings, prefix_cache=prefix_cache),
    ]
    for key, value in {**settings.extra_body, **cfg.bench_extra_body}.items():
        argv += ["--extra-body", f"{key}={json.dumps(value, separators=(',', ':'))}"]
    if post_run_cmd:
        argv += ["--post-run-cmd", post_run_cmd]
    argv += ["--format", "json", "--save-result", str(result), "--emit-progress", str(progress)]
    key_env = cfg.engine.api_key_env
    if key_env:
        argv[1:1] = ["--api-key", _key_placeholder(key_env)]
    return BenchyRun(tuple(argv), _offline_env(cfg), result, progress, key_env)


def _request_options(
    cfg: ServingConfig, depth: int, settings: BenchySettings, *, base_url: str, book_url: str, tokenizer: str
) -> list[str]:
    """Whom llama-benchy asks and what: the server, model, tokenizer, corpus, sizes and runs."""
    return [
        "--base-url",
        f"{base_url}/v1",
        "--model",
        cfg.checkpoint.served_model_name,
        "--served-model-name",
        cfg.checkpoint.served_model_name,
        "--tokenizer",
        tokenizer,
        "--book-url",
        book_url,
        "--pp",
        str(settings.pp),
        "--tg",
        str(settings.tg),
        "--depth",
        str(depth),
        "--runs",
        str(settings.runs),
        "--concurrency",
        str(settings.concurrency),
        "--latency-mode",
        settings.latency_mode,
    ]


def _switches(settings: BenchySettings, *, prefix_cache: bool) -> list[str]:
    switches = {
        "--exact-tg": settings.exact_tg,
        "--enable-prefix-caching": prefix_cache,
        "--no-warmup": not settings.warmup,
        "--skip-coherence": settings.skip_coherence,
    }
    return [switch for switch, on in switches.items() if on]


def _offline_env(cfg: ServingConfig) -> dict[str, str]:
    """llama-benchy's own home (where its corpus cache is), nothing downloaded, output unbuffered."""
    env = {
        "HOME": str(BENCHY_HOME.resolve()),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "PYTHONUNBUFFERED": "1",
    }
    if engine_kind(cfg.engine.kind).closes_streamed_connections:
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(ONE_CONNECTION_PER_REQUEST_SITE), os.environ.get("PYTHONPATH")])
        )
    return env


def _key_placeholder(variable: str) -> str:
    return f"<the key in ${variable}>"


def run(run: BenchyRun, *, timeout_s: float, what: str) -> float:
    """Run llama-benchy; its output goes to our stdout (the cell log). Returns wall seconds.

    It runs in its own process group, so a timeout or a signal to the cell ends all of it."""
    env = {**os.environ, **run.env}
    argv = list(run.argv)
    if run.api_key_env:
        argv = [os.environ[run.api_key_env] if a == _key_placeholder(run.api_key_env) else a for a in argv]
    log.info(f"+ {shlex.join(run.argv)}")
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        env=env,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    # its output still goes to the cell log; the last line also goes into a failure's reason
    last_lines: deque[str] = deque(maxlen=1)
    tee = threading.Thread(target=_tee, args=(proc.stdout, last_lines), daemon=True)
    tee.start()
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired as err:
        _kill_group(proc)
        raise BenchmarkError(
            f"{what}: llama-benchy still running after {timeout_s:g} s; killed",
            hint="raise benchy.timeout_s, or check the engine log for a hang",
        ) from err
    except BaseException:
        _kill_group(proc)
        raise
    wall = time.monotonic() - started
    tee.join(timeout=5)  # the rest of its output, before our next log line
    if rc != 0:
        how = f"was killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with code {rc}"
        said = f"; its last line: {last_lines[0]}" if last_lines else ""
        raise BenchmarkError(f"{what}: llama-benchy {how}{said}", hint="read the cell log above this line")
    return wall


def _tee(stream: IO[bytes], last_lines: deque[str]) -> None:
    for line in stream:
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
        if line.strip():
            last_lines.append(line.decode(errors="replace").strip())


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


@dataclass(frozen=True)
class RequestEnd:
    """A request_end event of llama-benchy's progress file: how one request ended."""

    error: str | None  # empty or None when it succeeded
    total_tokens: int | None  # the tokens it generated, when it got that far


def read_progress(path: Path) -> list[RequestEnd]:
    """The requests' ends, in the order llama-benchy wrote them; none without a file."""
    if not path.exists():
        return []
    events = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return [
        RequestEnd(event.get("error"), event.get("total_tokens"))
        for event in events
        if event.get("type") == "request_end"
    ]


TRANSPORT_ERRORS = ("Server disconnected", "Can not write request body", "Connection reset")


class RetryableError(BenchmarkError):
    """A measurement spoiled by something passing, not by the engine: worth another attempt
    (``benchy.transport_retries``), each discarded one listed in the provenance."""


class TransportError(RetryableError):
    """Requests failed at the connection level (the server closed a kept-alive connection
    the client reused), not with an engine error."""


class BurstError(RetryableError):
    """A request's answer was read in one burst, so llama-benchy has no decode time for it:
    every chunk arrived at once because the client was not scheduled while the engine
    generated (a loaded machine), though no request failed."""


@dataclass(frozen=True)
class Metric:
    """One of llama-benchy's metrics over a run: its mean and std, and its values (one per
    run, or per request). Every field is None where the result leaves the metric out or null."""

    mean: float | None = None
    std: float | None = None
    values: tuple[float, ...] | None = None

    @property
    def count(self) -> int | None:
        """How many values it has (None: no list of them)."""
        return None if self.values is None else len(self.values)


UNMEASURED = Metric()

# llama-benchy writes null for a metric it could not measure: a Metric of no values, so
# that a reader asks any metric for its mean
_metric_fields = make_dict_structure_fn(Metric, codec.converter)
_metric_document = make_dict_unstructure_fn(Metric, codec.converter)
codec.converter.register_structure_hook(
    Metric, lambda value, cls: UNMEASURED if value is None else _metric_fields(value, cls)
)
codec.converter.register_unstructure_hook(
    Metric, lambda metric: None if metric == UNMEASURED else _metric_document(metric)
)

# a throughput time series: [timestamp, value] pairs
TimeSeries = tuple[tuple[float, ...], ...]


@dataclass(frozen=True)
class BenchyEntry:
    """One entry of llama-benchy's ``benchmarks``: a (context size, prompt size) measured at a
    concurrency, under llama-benchy's names and in its order (a key it leaves out: None)."""

    concurrency: int | None = None
    context_size: int | None = None
    prompt_size: int | None = None
    response_size: int | None = None
    # --enable-prefix-caching runs a context-load phase before each measured one
    is_context_prefill_phase: bool = False
    pp_throughput: Metric = UNMEASURED
    pp_req_throughput: Metric = UNMEASURED
    tg_throughput: Metric = UNMEASURED
    tg_req_throughput: Metric = UNMEASURED
    peak_throughput: Metric = UNMEASURED
    peak_req_throughput: Metric = UNMEASURED
    ttfr: Metric = UNMEASURED
    est_ppt: Metric = UNMEASURED
    e2e_ttft: Metric = UNMEASURED
    # only with llama-benchy's --save-*-throughput-timeseries, which gridbench never passes
    throughput_over_time: tuple[TimeSeries, ...] | None = None
    requests_throughput_over_time: tuple[tuple[TimeSeries, ...], ...] | None = None

    def metric(self, name: str) -> Metric:
        """A metric by its llama-benchy name (the checks name them in their messages)."""
        if name not in METRICS:
            raise KeyError(f"gridbench reads no llama-benchy metric {name}")
        metric: Metric = getattr(self, name)
        return metric


# the metrics gridbench reads: BenchyEntry's Metric fields
METRICS = (
    "pp_throughput",
    "pp_req_throughput",
    "tg_throughput",
    "tg_req_throughput",
    "peak_throughput",
    "peak_req_throughput",
    "ttfr",
    "est_ppt",
    "e2e_ttft",
)


@dataclass(frozen=True)
class BenchyResult:
    """llama-benchy's result document (--format json), its keys in its order; gridbench reads
    the version, whether prefix caching was on, and the entries."""

    version: str | None = None
    timestamp: str | None = None
    latency_mode: str | None = None
    latency_ms: float | None = None
    model: str | None = None
    prefix_caching_enabled: bool | None = None  # None: a version that does not say
    max_concurrency: int | None = None
    benchmarks: tuple[BenchyEntry, ...] = ()

    @classmethod
    def from_json(cls, document: object) -> BenchyResult:
        """The result in a parsed JSON document; ResultFileError when it is not one."""
        if not isinstance(document, dict) or not isinstance(document.get("benchmarks"), list):
            raise ResultFileError("not a llama-benchy result (no 'benchmarks' list)")
        if not all(isinstance(entry, dict) for entry in document["benchmarks"]):
            raise ResultFileError("not a llama-benchy result (a 'benchmarks' entry is not an object)")
        try:
            return codec.from_json(cls, document)
        except cattrs.BaseValidationError as err:
            raise ResultFileError(
                f"not a llama-benchy result ({'; '.join(cattrs.transform_error(err))})"
            ) from err


def entries_at(result: BenchyResult, depth: int) -> tuple[list[BenchyEntry], list[BenchyEntry]]:
    """llama-benchy's entries for ``depth``: the measured ones, and the context-load phases
    that its --enable-prefix-caching mode runs before them."""
    at_depth = [entry for entry in result.benchmarks if entry.context_size == depth]
    loads = [entry for entry in at_depth if entry.is_context_prefill_phase]
    return [entry for entry in at_depth if not entry.is_context_prefill_phase], loads


def check_result(
    result: BenchyResult,
    ends: Sequence[RequestEnd],
    *,
    depth: int,
    settings: BenchySettings,
    what: str,
    prefix_cache: bool = False,
) -> BenchyEntry:
    """The measured benchmark entry of a run, after checking that it counts.

    It must cover the cell's depth, carry every required metric with one value per request,
    have no failed request and, with exact-tg, exactly tg generated tokens per request. A
    prefix-cache cell must also hold the context-load phase: without it the entry would be
    a cold measurement; its required metric is the time to first token alone."""
    entry = _measured_entry(result, depth=depth, what=what, prefix_cache=prefix_cache)
    # before the metrics: a failed request leaves them null, and its error is the reason
    _check_no_request_failed(ends, what=what)
    _check_every_metric_measured(entry, ends, settings=settings, what=what, prefix_cache=prefix_cache)
    if settings.exact_tg:
        _check_exact_tg(ends, settings=settings, what=what, prefix_cache=prefix_cache)
    return entry


def _phases(*, prefix_cache: bool) -> int:
    """The phases each measured request comes with: a prefix-cache cell loads its context first."""
    return 2 if prefix_cache else 1


def _measured_entry(result: BenchyResult, *, depth: int, what: str, prefix_cache: bool) -> BenchyEntry:
    entries, loads = entries_at(result, depth)
    if len(entries) != 1:
        raise BenchmarkError(f"{what}: llama-benchy reported {len(entries)} results for depth {depth}")
    if prefix_cache and len(loads) != 1:
        raise BenchmarkError(
            f"{what}: llama-benchy reported {len(loads)} context-load phases for depth {depth}, expected 1 "
            "(--enable-prefix-caching)",
            hint="check that the llama-benchy in use supports --enable-prefix-caching",
        )
    return entries[0]


def _check_no_request_failed(ends: Sequence[RequestEnd], *, what: str) -> None:
    # the progress events do not say which phase a request belongs to: both must succeed
    errors = [e.error for e in ends if e.error]
    if errors:
        kind = (
            TransportError
            if all(any(t in err for t in TRANSPORT_ERRORS) for err in errors)
            else BenchmarkError
        )
        raise kind(
            f"{what}: {len(errors)} requests failed, first: {errors[0]}",
            hint="read the cell log and the engine log",
        )


def _check_every_metric_measured(
    entry: BenchyEntry,
    ends: Sequence[RequestEnd],
    *,
    settings: BenchySettings,
    what: str,
    prefix_cache: bool,
) -> None:
    """Every required metric has a value, and every per-request metric one value per request."""
    expected = settings.runs * settings.concurrency
    required = CACHED_REQUIRED_METRICS if prefix_cache else REQUIRED_METRICS
    per_request = CACHED_PER_REQUEST_METRICS if prefix_cache else PER_REQUEST_METRICS
    # every request ended without an error, yet a value is missing: an answer read in one burst
    unmeasured = BurstError if len(ends) >= expected * _phases(prefix_cache=prefix_cache) else BenchmarkError
    for metric in required:
        if entry.metric(metric).mean is None:
            raise unmeasured(
                f"{what}: llama-benchy could not measure {metric} (null)",
                hint="rerun the cell; a loaded machine can leave it unmeasured",
            )
    for metric in per_request:
        count = entry.metric(metric).count or 0
        if count != expected:
            counted = (
                f"{what}: {metric} has {count} values, expected {expected} "
                f"(runs {settings.runs} x concurrency {settings.concurrency})"
            )
            if unmeasured is BurstError:
                raise BurstError(
                    f"{counted}: an answer was read in one burst, with no decode time to measure",
                    hint="rerun the cell; a loaded machine can leave it unmeasured",
                )
            raise BenchmarkError(
                f"{counted}: requests failed", hint="read the cell log for the failed requests' errors"
            )


def _check_exact_tg(
    ends: Sequence[RequestEnd], *, settings: BenchySettings, what: str, prefix_cache: bool
) -> None:
    expected = settings.runs * settings.concurrency * _phases(prefix_cache=prefix_cache)
    measured = [e.total_tokens for e in ends if e.total_tokens is not None]
    # a context load generates tg tokens too (llama-benchy sends it with the same max_tokens)
    wrong = [tokens for tokens in measured[-expected:] if tokens != settings.tg]
    if len(measured) < expected or wrong:
        raise BenchmarkError(
            f"{what}: exact-tg asked for {settings.tg} tokens per request, got "
            f"{wrong or 'fewer requests than runs'}",
            hint="the engine ignored min_tokens/ignore_eos; check its version and flags",
        )
