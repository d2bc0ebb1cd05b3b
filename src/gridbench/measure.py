"""How each cell kind measures on a leased engine: llama-benchy at a depth, or the natural
harness at a concurrency, each bracketed by the engine's spec-decode counters when it speculates.
"""

from __future__ import annotations

import json
import logging
import shlex
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import gridbench
from gridbench import codec, layout, provenance
from gridbench.cell_records import BenchyInvocation, Measured, NaturalInvocation
from gridbench.engines import probe
from gridbench.engines.events import now_iso
from gridbench.engines.kinds import engine_kind
from gridbench.engines.manager import EngineLease
from gridbench.errors import BenchmarkError, ResultFileError
from gridbench.harness import benchy, stats
from gridbench.spec_metrics import Acceptance, acceptance, parse_spec_counters

if TYPE_CHECKING:  # cell.py calls these functions: its cell kinds are only named here
    from gridbench.cell import DepthCell, NaturalCell

log = logging.getLogger(__name__)


def measure_benchy(spec: DepthCell, engine: EngineLease, scratch: Path) -> Measured:
    """llama-benchy at the cell's depth, bracketed by spec-decode counter snapshots."""
    cfg = spec.serving_config
    settings = spec.benchy
    # a cold cell starts from an empty cache; a prefix-cache cell too, so that only its own
    # context loads are there to hit, not what earlier cells left
    cache_reset = engine_kind(cfg.engine.kind).reset_prefix_cache(engine.base_url, engine.headers)
    book_url = benchy.seed_corpus(Path(settings.corpus))
    snapshots = scratch / "metrics"
    post_run = (
        snapshot_command(engine.base_url, snapshots, cfg.engine.api_key_env)
        if cfg.speculation.enabled
        else None
    )
    attempts: list[str] = []
    while True:
        shutil.rmtree(snapshots, ignore_errors=True)
        if post_run:
            snapshots.mkdir()
        run = benchy.build_run(
            cfg,
            spec.depth,
            settings,
            base_url=engine.base_url,
            book_url=book_url,
            workdir=scratch,
            post_run_cmd=post_run,
            prefix_cache=spec.prefix_cache,
        )
        before_own = probe.fetch_metrics(engine.base_url, engine.headers) if post_run else None
        bench_started = now_iso()
        wall_s = benchy.run(run, timeout_s=settings.timeout_s, what=spec.what)
        after = probe.fetch_metrics(engine.base_url, engine.headers) if post_run else None
        try:
            raw = run.result_path.read_bytes()
            result = benchy.BenchyResult.from_json(json.loads(raw))
        except (FileNotFoundError, json.JSONDecodeError, ResultFileError) as err:
            raise BenchmarkError(f"{spec.what}: llama-benchy wrote no readable result: {err}") from err
        try:
            entry = benchy.check_result(
                result,
                benchy.read_progress(run.progress_path),
                depth=spec.depth,
                settings=settings,
                what=spec.what,
                prefix_cache=spec.prefix_cache,
            )
            break
        except benchy.RetryableError as err:
            attempts.append(err.message)
            if len(attempts) > settings.transport_retries:
                raise
            log.info(f"{err.message}; measuring the cell again (attempt {len(attempts) + 1})")
    spec_decode = None
    if post_run:
        spec_decode = _acceptance(snapshots, before_own, after, settings.warmup, spec.what)
    decode = entry.tg_throughput.mean
    log.info(
        f"{spec.what}: decode {'-' if decode is None else f'{decode:.2f}'} tok/s, "
        f"TTFT {entry.e2e_ttft.mean:.1f} ms"
    )
    return Measured(
        files={"raw": raw},
        versions=provenance.versions("llama-benchy", result.version),
        bench=BenchyInvocation(
            argv=run.argv,
            started_at=bench_started,
            finished_at=now_iso(),
            wall_s=round(wall_s, 3),
            discarded_attempts=tuple(attempts),
        ),
        prefix_cache_reset=cache_reset,
        spec_decode=spec_decode,
    )


def snapshot_command(base_url: str, out_dir: Path, key_variable: str | None) -> str:
    """Shell line for llama-benchy's --post-run-cmd: save /metrics after every run."""
    argv = [sys.executable, "-m", "gridbench.snapshot", f"{base_url}/metrics", str(out_dir.resolve())]
    return shlex.join(argv + ([key_variable] if key_variable else []))


def _acceptance(
    snapshots: Path, before_own: str | None, after: str | None, warmup: bool, what: str
) -> Acceptance:
    files = sorted(snapshots.glob("*.prom"))
    # after llama-benchy's warm-up run comes the first snapshot: the measured window starts there
    before_text = files[0].read_text() if warmup and files else before_own
    if before_text is None or after is None:
        raise BenchmarkError(f"{what}: could not read the engine's /metrics around the measured window")
    window = "after llama-benchy's warm-up run" if warmup and files else "whole invocation"
    return acceptance(parse_spec_counters(before_text), parse_spec_counters(after), window)


def measure_natural(spec: NaturalCell, engine: EngineLease, scratch: Path) -> Measured:
    """Warm up, then the measured requests, bracketed by spec-decode counter snapshots."""
    from gridbench.harness import natural  # aiohttp: a quarter second llama-benchy cells skip

    cfg = spec.serving_config
    settings = spec.natural
    # the config's bench extra_body over the harness's
    settings = replace(settings, extra_body={**settings.extra_body, **cfg.bench_extra_body})
    plan = natural.level_plan(settings, spec.prompt, spec.concurrency)
    endpoint = natural.Endpoint(engine.base_url, cfg.checkpoint.served_model_name, engine.headers)
    cache_reset = engine_kind(cfg.engine.kind).reset_prefix_cache(engine.base_url, engine.headers)
    started_at = now_iso()
    progress = scratch / layout.NATURAL_PROGRESS  # read live by `gridbench progress`
    warmups = natural.warm_up(endpoint, plan, progress)
    for trace in warmups:
        if trace.status != "ok":
            log.info(f"{spec.what}: warm-up request {trace.index} {trace.status}: {trace.error}")
    before = _settled_metrics(engine) if cfg.speculation.enabled else None
    window_started = time.monotonic()
    traces = natural.measure_level(endpoint, plan, progress)
    wall_s = time.monotonic() - window_started
    after = _settled_metrics(engine) if cfg.speculation.enabled else None
    spec_decode = None
    if cfg.speculation.enabled:
        if before is None or after is None:
            raise BenchmarkError(
                f"{spec.what}: could not read the engine's /metrics around the measured window"
            )
        spec_decode = acceptance(
            parse_spec_counters(before),
            parse_spec_counters(after),
            "the measured requests (after the warm-up requests)",
        )
    result = natural.level_result(
        config=cfg.name, prompt_class=spec.prompt_class, plan=plan, traces=traces, spec_decode=spec_decode
    )
    raw = (json.dumps(codec.to_json(result), indent=1, allow_nan=False) + "\n").encode()
    summary = result.summary
    error_rate = summary.error_rate or 0.0  # None only for a level of no requests
    if error_rate > settings.max_error_rate:
        (scratch / "natural.json").write_bytes(raw)  # kept beside the failure record
        first = next(r.error for r in result.requests if r.status != "ok")
        raise BenchmarkError(
            f"{spec.what}: {summary.errored} errored and {summary.incomplete} incomplete of "
            f"{summary.requests} requests (error rate {error_rate:.2f} > "
            f"natural.max_error_rate {settings.max_error_rate:g}); first: {first}",
            hint="read the engine log; every request's outcome is in the kept natural.json",
        )
    log.info(
        f"{spec.what}: {summary.output_tok_s} tok/s aggregate, TTFT p50 {summary.ttft_ms.p50} ms, "
        f"TPOT p50 {summary.tpot_ms.p50} ms, {summary.ok}/{summary.requests} ok"
    )
    return Measured(
        files={"raw": raw},
        versions=provenance.versions(natural.LOAD_GENERATOR, gridbench.__version__),
        bench=NaturalInvocation(
            url=endpoint.url,
            model=endpoint.model,
            started_at=started_at,
            finished_at=now_iso(),
            wall_s=round(wall_s, 3),
            harness_processes=plan.processes,
            warmup=stats.warmup_outcomes(warmups),
        ),
        prefix_cache_reset=cache_reset,
        spec_decode=spec_decode,
    )


def _settled_metrics(engine: EngineLease, timeout_s: float = 5.0) -> str | None:
    """/metrics once its spec-decode counters stop moving: the last responses' counts are in."""
    deadline = time.monotonic() + timeout_s
    text = probe.fetch_metrics(engine.base_url, engine.headers)
    while text is not None and time.monotonic() < deadline:
        time.sleep(0.1)
        again = probe.fetch_metrics(engine.base_url, engine.headers)
        if again is None or parse_spec_counters(again) == parse_spec_counters(text):
            return again
        text = again
    return text
