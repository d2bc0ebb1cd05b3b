"""Synthetic cell records shaped like real ones, for the report's tests and the aggregation
benchmark: llama-benchy's JSON (a third party's format, spelled here), and gridbench's own
files (natural result, provenance, failure record) built as the records a cell writes, so
each format has one owner; and a trained draft's files, its heads mere bytes. Nothing in a
sweep uses them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from gridbench import layout
from gridbench.cells.kinds.benchy import DepthCellPlan
from gridbench.cells.kinds.natural import NaturalCellPlan
from gridbench.cells.provenance import GpuInfo, HostInfo, Versions, redact_config
from gridbench.cells.records import (
    BenchyInvocation,
    CellCoordinates,
    CellProvenance,
    EngineRecord,
    FailureRecord,
)
from gridbench.cells.telemetry import absent
from gridbench.config.grid import ServingConfig
from gridbench.drafts.recipe import DraftPaths, read_recipe, recipe_record, write_prompts
from gridbench.drafts.records import StepFacts
from gridbench.engines.runtime import ImageInfo
from gridbench.engines.spec_metrics import Acceptance, SpecCounters, acceptance
from gridbench.harness.benchy import UNMEASURED, BenchyEntry, BenchyResult, Metric
from gridbench.harness.natural import LevelPlan, LevelResult
from gridbench.harness.stats import Distribution, LevelSummary, RequestRecord
from gridbench.util import codec
from gridbench.util.files import atomic_write_json

STARTED_AT = "2026-07-09T12:00:00.000+00:00"

MAX_TOKENS = 512  # the natural levels' limit, as seed 000's


def _runs(mean: float, std: float, runs: int) -> Metric:
    """Run values with exactly this mean and population std (as llama-benchy reports)."""
    offsets = (
        [(-1) ** i for i in range(runs)] if runs % 2 == 0 else [0.0] + [(-1) ** i for i in range(runs - 1)]
    )
    scale = std * (runs / max(1, sum(o * o for o in offsets))) ** 0.5
    return Metric(mean, std, tuple(mean + o * scale for o in offsets))


def benchy_raw(
    depth: int,
    *,
    decode: tuple[float, float],
    prefill: tuple[float, float],
    ttft_ms: tuple[float, float],
    pp: int = 512,
    tg: int = 256,
    runs: int = 2,
    version: str = "0.4.0",
) -> BenchyResult:
    """llama-benchy 0.4.0's --format json for one depth; (mean, std) per metric."""
    peak = (round(decode[0] + 0.5), round(decode[1]))
    entry = BenchyEntry(
        concurrency=1,
        context_size=depth,
        prompt_size=pp,
        response_size=tg,
        is_context_prefill_phase=False,
        pp_throughput=_runs(*prefill, runs),
        pp_req_throughput=_runs(*prefill, runs),
        tg_throughput=_runs(*decode, runs),
        tg_req_throughput=_runs(*decode, runs),
        peak_throughput=_runs(*peak, runs),
        peak_req_throughput=_runs(*peak, runs),
        ttfr=_runs(*ttft_ms, runs),
        est_ppt=_runs(ttft_ms[0] * 0.95, ttft_ms[1], runs),
        e2e_ttft=_runs(*ttft_ms, runs),
    )
    return BenchyResult(
        version=version,
        timestamp="2026-07-09 12:00:00Z",
        latency_mode="generation",
        latency_ms=100.0,
        model="model",
        prefix_caching_enabled=False,
        max_concurrency=1,
        benchmarks=(entry,),
    )


def cached_benchy_raw(
    depth: int,
    *,
    load_ttft_ms: tuple[float, float],
    ttft_ms: tuple[float, float],
    prefill: tuple[float, float] | None,
    decode: tuple[float, float] = (20.0, 0.2),
    pp: int = 512,
    tg: int = 256,
    runs: int = 2,
) -> BenchyResult:
    """llama-benchy's --enable-prefix-caching result for one depth: the context-load phase,
    then the measured phase; ``prefill`` None leaves pp_throughput null, as llama-benchy does
    when a cached answer came within its measured latency."""
    raw = benchy_raw(
        depth, decode=decode, prefill=prefill or (0.0, 0.0), ttft_ms=ttft_ms, pp=pp, tg=tg, runs=runs
    )
    (measured,) = raw.benchmarks
    if prefill is None:
        measured = replace(measured, pp_throughput=UNMEASURED, pp_req_throughput=UNMEASURED)
    load = benchy_raw(
        depth, decode=decode, prefill=(2000.0, 20.0), ttft_ms=load_ttft_ms, pp=pp, tg=tg, runs=runs
    )
    (context,) = load.benchmarks
    context = replace(context, is_context_prefill_phase=True)
    return replace(raw, prefix_caching_enabled=True, benchmarks=(context, measured))


def spec_decode(drafts: int, per_position: Sequence[float]) -> Acceptance:
    """What gridbench.engines.spec_metrics.acceptance records for these per-position rates."""
    accepted = {i: round(rate * drafts) for i, rate in enumerate(per_position)}
    after = SpecCounters(
        drafts=float(drafts),
        draft_tokens=float(drafts * len(per_position)),
        accepted_tokens=float(sum(accepted.values())),
        accepted_per_pos={i: float(v) for i, v in accepted.items()},
        present=True,
    )
    return acceptance(SpecCounters(present=True), after, "after llama-benchy's warm-up run")


def host_info(
    *, hostname: str = "host", gpu: str | None = None, gpu_count: int = 0, driver: str | None = None
) -> HostInfo:
    """A host as gridbench.cells.provenance.host_info describes one: these GPUs, the rest fixed."""
    return HostInfo(
        hostname=hostname,
        platform="Linux",
        machine="aarch64",
        cpu_count=20,
        python="3.12.3",
        gpus=GpuInfo(gpu=gpu, gpu_count=gpu_count, driver=driver, gpu_memory=None),
        slurm_job_id=None,
    )


def provenance_record(
    cfg: ServingConfig,
    cell: str,
    *,
    host: HostInfo | None = None,
    image_id: str | None = None,
    image_digest: str | None = None,
    engine_version: str | None = None,
    startup_s: float = 300.0,
    reused: bool = True,
    load_generator: str = "llama-benchy",
    load_generator_version: str | None = "0.4.0",
    spec: Acceptance | None = None,
    started_at: str = STARTED_AT,
    finished_at: str = "2026-07-09T12:01:00.000+00:00",
    bench_wall_s: float = 55.0,
) -> CellProvenance:
    """The provenance gridbench.cells.run.run_cell records, for a cell on slot 0 of ``host``
    (``host_info()`` by default); a natural cell's (another load generator) has no bench."""
    argv = (*cfg.engine.command, "--model", cfg.checkpoint.model, *cfg.serve_args)
    engine = EngineRecord(
        kind=cfg.engine.kind,
        runtime=cfg.engine.runtime,
        image=ImageInfo(cfg.engine.image, image_id, image_digest, command=tuple(cfg.engine.command)),
        version=engine_version,
        serve_argv=argv,
        serve_command=" ".join(argv),
        base_url=f"http://{cfg.engine.host}:{cfg.engine.port}",
        slot="0",
        slots=("0",),
        gpus=(),
        started_at=started_at,
        startup_s=startup_s,
        reused=reused,
    )
    bench = (
        BenchyInvocation(
            argv=("llama-benchy", "--depth", "0"),
            started_at=started_at,
            finished_at=finished_at,
            wall_s=bench_wall_s,
            discarded_attempts=(),
        )
        if load_generator == "llama-benchy"
        else None
    )
    return CellProvenance(
        cell=cell,
        config=cfg.name,
        fingerprint=cfg.fingerprint(),
        effective_config=codec.to_json(redact_config(cfg)),
        engine=engine,
        host=host or host_info(),
        started_at=started_at,
        finished_at=finished_at,
        versions=Versions("0.1.0", load_generator, load_generator_version),
        bench=bench,
        prefix_cache_reset=True,
        spec_decode=spec,
        telemetry=absent("NVML unavailable: a synthetic record read no GPU"),
    )


def _distribution(p50: float, p95: float) -> Distribution:
    """A metric's statistics from its p50 and p95: the mean between them, p99 just above p95."""
    return Distribution(mean=(p50 + p95) / 2, p50=p50, p95=p95, p99=p95 * 1.02)


def natural_raw(
    config: str,
    prompt_class: str,
    concurrency: int,
    *,
    output_tok_s: float,
    ttft_ms: tuple[float, float],
    tpot_ms: tuple[float, float],
    output_tokens: int,
    wall_s: float,
    requests: int = 16,
    errored: int = 0,
    spec: Acceptance | None = None,
) -> LevelResult:
    """The natural harness's result for one level; (p50, p95) latencies, the last
    ``errored`` requests failed."""
    ttft_p50, ttft_p95 = ttft_ms
    tpot_p50, tpot_p95 = tpot_ms
    # a chunk per engine step, as vLLM streams: the drafts a request's steps accepted (its share
    # of the counters') arrive with the step's own token
    accepted = round(spec.delta_accepted_tokens / (requests - errored)) if spec and requests > errored else 0
    steps = max(output_tokens - 1 - accepted, 0)
    records = []
    for i in range(requests):
        failed = i >= requests - errored
        spread = (i % 4) / 3  # 0 .. 1
        ttft = ttft_p50 + (ttft_p95 - ttft_p50) * spread
        tpot = tpot_p50 + (tpot_p95 - tpot_p50) * spread
        e2e = ttft + tpot * (output_tokens - 1)
        start_s = i / max(1, concurrency) * e2e / 1000
        records.append(
            RequestRecord(
                index=i,
                status="errored" if failed else "ok",
                error="HTTP 500: Internal Server Error" if failed else None,
                start_s=round(start_s, 3),
                end_s=round(start_s + e2e / 1000, 3),
                ttft_ms=None if failed else ttft,
                e2e_ms=None if failed else e2e,
                tpot_ms=None if failed else tpot,
                output_tokens=None if failed else output_tokens,
                tokens_per_s=None if failed else output_tokens / e2e * 1000,
                itl_ms=() if failed else (tpot,) * steps,
                # an answer shorter than max_tokens ended on the model's EOS
                finish_reason=None if failed else ("length" if output_tokens >= MAX_TOKENS else "stop"),
            )
        )
    e2e_p50 = ttft_p50 + tpot_p50 * (output_tokens - 1)
    e2e_p95 = ttft_p95 + tpot_p95 * (output_tokens - 1)
    summary = LevelSummary(
        requests=requests,
        ok=requests - errored,
        errored=errored,
        incomplete=0,
        error_rate=errored / requests,
        wall_s=wall_s,
        output_tok_s=output_tok_s,
        output_tokens_p50=output_tokens,
        ttft_ms=_distribution(ttft_p50, ttft_p95),
        tpot_ms=_distribution(tpot_p50, tpot_p95),
        itl_ms=_distribution(tpot_p50, tpot_p95),
        e2e_ms=_distribution(e2e_p50, e2e_p95),
        req_tok_s=_distribution(output_tokens / e2e_p95 * 1000, output_tokens / e2e_p50 * 1000),
        percentile_warnings=(f"p99 from {requests} requests is the maximum",) if requests < 100 else (),
    )
    plan = LevelPlan(
        prompt=f"a {prompt_class} prompt",
        concurrency=concurrency,
        requests=requests,
        warmup=3,
        max_tokens=MAX_TOKENS,
        temperature=0,
        cache_bust=True,
        extra_body={},
        request_timeout_s=600.0,
    )
    return LevelResult.of(config, prompt_class, plan, tuple(records), summary, spec)


def failure_record(
    cell: DepthCellPlan | NaturalCellPlan, what: str, reason: str, *, prefix_cache: bool = False
) -> FailureRecord:
    """The failure record gridbench.cells.run writes under results/failures/ when the engine died."""
    depth = cell if isinstance(cell, DepthCellPlan) else None
    natural = cell if isinstance(cell, NaturalCellPlan) else None
    return FailureRecord(
        cell=what,
        config=cell.config,
        kind="natural" if natural else "benchy",
        coordinates=CellCoordinates(
            depth=depth.depth if depth else None,
            prefix_cache=prefix_cache,
            prompt_class=natural.prompt_class if natural else None,
            concurrency=natural.concurrency if natural else None,
        ),
        error_type="EngineDiedError",
        reason=reason,
        hint="read the engine log; the next cell starts a fresh engine",
        exit_code=1,
        engine_log_tail="",
        started_at=STARTED_AT,
        failed_at="2026-07-09T12:00:30.000+00:00",
        cell_log=cell.files.log,
    )


def write_cell(
    cell: DepthCellPlan | NaturalCellPlan, raw: BenchyResult | LevelResult, prov: CellProvenance, root: Path
) -> None:
    """A cell's result and provenance files."""
    atomic_write_json(root / cell.files.raw, codec.to_json(raw))
    atomic_write_json(root / cell.files.provenance, codec.to_json(prov))


def trained_draft(draft: str) -> DraftPaths:
    """Every file a draft's steps write, as they write them, in the working directory (its recipe
    file written there already); the heads are bytes."""
    recipe = read_recipe(Path(layout.DRAFT_RECIPE_FILE.format(draft=draft)))
    paths = DraftPaths.of(recipe)
    if "prompts" in paths.own_steps:
        atomic_write_json(paths.step("prompts"), codec.to_json(write_prompts(recipe, paths)))
        paths.answers.write_text('{"answer": "a"}\n')
        for step in ("answers", "dataset", "hidden-states"):
            atomic_write_json(paths.step(step), codec.to_json(StepFacts(step=step, wall_s=1.0)))
    for folder, content in ((paths.head, b"trained"), (paths.untrained_head, b"untrained")):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps({"draft": draft}))
        (folder / "model.safetensors").write_bytes(content + os.urandom(64))
    metrics = {"epoch": 0, "global_step": 0, "train": {"loss": 9.0, "full_acc_0": 0.1}}
    paths.train_metrics.write_text(json.dumps(metrics) + "\n")
    atomic_write_json(paths.step("train"), codec.to_json(StepFacts(step="train", wall_s=2.0, epochs=1)))
    atomic_write_json(paths.record, codec.to_json(recipe_record(recipe, paths)))
    return paths
