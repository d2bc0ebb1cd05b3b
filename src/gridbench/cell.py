"""One cell, end to end: lease a ready engine, measure, check, and write the result.

A cell either writes its result files complete (atomically) or writes none and leaves a
failure record under ``results/failures/`` instead; a later success removes the record.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import shlex
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import gridbench
from gridbench import layout, provenance
from gridbench.engines import probe
from gridbench.engines.manager import EngineLease, SlotManager, now_iso
from gridbench.errors import BenchmarkError, DiskFullError, EngineDiedError, EngineError, GridbenchError
from gridbench.files import atomic_write_bytes, atomic_write_json, atomic_write_text
from gridbench.grid import BenchySettings, Grid, ServingConfig
from gridbench.harness import benchy
from gridbench.harness.prompts import AUTO_PROCESSES, NaturalSettings, resolve_prompts
from gridbench.spec_metrics import acceptance, parse_spec_counters

log = logging.getLogger(__name__)

FAILURE_DIR = Path("results/failures")
TMP_DIR = Path(layout.SCRATCH)
# below this, a failed cell is blamed on the disk: a load generator's result is larger
_NEARLY_FULL_BYTES = 1 << 20


CONTEXT_DIR = Path(".gridbench/contexts")


@dataclass(frozen=True)
class CellSpec:
    """Everything a cell process needs: its config's context file plus the cell's coordinates."""

    kind: str  # "benchy" or "natural"
    config: dict[str, Any]  # ServingConfig.to_dict()
    slots: list[str]
    depth: int | None = None
    benchy: dict[str, Any] | None = None
    prompt_class: str | None = None
    concurrency: int | None = None
    natural: dict[str, Any] | None = None

    @classmethod
    def from_context(cls, path: Path, kind: str, **coordinates: Any) -> CellSpec:
        context = json.loads(Path(path).read_text())
        if kind == "natural":
            settings = context.pop("natural")
            prompts = settings.pop("prompts")
            context["natural"] = {**settings, "prompt": prompts[coordinates["prompt_class"]]}
        return cls(kind=kind, **context, **coordinates)

    @property
    def serving_config(self) -> ServingConfig:
        return ServingConfig.from_dict(self.config)

    @property
    def cell_id(self) -> str:
        if self.kind == "benchy":
            return layout.BENCHY_CELL_ID.format(depth=self.depth)
        return layout.NATURAL_CELL_ID.format(prompt_class=self.prompt_class, concurrency=self.concurrency)

    @property
    def what(self) -> str:
        name = self.config["name"]
        if self.kind == "benchy":
            return f"cell {name} depth {self.depth}"
        return f"cell {name} {self.prompt_class} c={self.concurrency}"

    def failure_path(self) -> Path:
        sub = "" if self.kind == "benchy" else "natural/"
        return FAILURE_DIR / sub / self.config["name"] / f"{self.cell_id}.json"

    def log_path(self) -> Path:
        name = self.cell_id if self.kind == "benchy" else f"natural_{self.cell_id}"
        return Path("logs/cells") / self.config["name"] / f"{name}.log"


def write_context(grid: Grid, config: str, slots: list[str], kind: str) -> Path:
    """What one config's cells of one kind share, in a file named by its content: a cell's
    params (the path) change exactly when what it measures changes. Natural contexts carry
    the prompt strings themselves, so an edited prompt file reruns its cells."""
    context: dict[str, Any] = {"config": grid.config_dict(config), "slots": slots}
    if kind == "benchy":
        context["benchy"] = asdict(grid.benchy)
    else:
        prompts = resolve_prompts(NaturalSettings.from_dict(grid.natural))
        context["natural"] = {**grid.natural, "prompts": prompts}
        if context["natural"]["processes"] == AUTO_PROCESSES:
            # it changes how many requests fit, not what a cell measures: the default keeps
            # the contexts (the cells' params) of studies measured before the key existed
            del context["natural"]["processes"]
    text = json.dumps(context, sort_keys=True, separators=(",", ":"))
    path = CONTEXT_DIR / f"{config}-{kind}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.json"
    if not path.exists():
        atomic_write_text(path, text)
    return path


def cell_spec(grid: Grid, config: str, slots: list[str], kind: str, **coordinates: Any) -> CellSpec:
    """The spec a cell process will read: its context file written, the coordinates added."""
    return CellSpec.from_context(write_context(grid, config, slots, kind), kind, **coordinates)


class _Interrupted(BaseException):
    """SIGTERM/SIGINT reached the cell: clean up, write nothing, exit non-zero."""


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    def handler(signum, _frame):
        raise _Interrupted(signal.Signals(signum).name)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _engine_record(engine: EngineLease, cfg: ServingConfig) -> dict[str, Any]:
    return {
        "kind": cfg.engine.kind,
        "runtime": cfg.engine.runtime,
        **engine.image,
        "version": engine.version,
        "serve_argv": list(engine.plan.argv),
        "serve_command": engine.plan.shell_line(),
        "base_url": engine.base_url,
        "slot": engine.slot,
        "slots": list(engine.slots),
        "gpus": provenance.slot_gpus(engine.slots),  # index, UUID, name of each slot's GPU
        "started_at": engine.started_at,
        "startup_s": engine.ready_s,
        "reused": engine.reused,
    }


def run_cell(
    spec: CellSpec, outputs: dict[str, Path], measure: Callable[[CellSpec, EngineLease, Path], dict[str, Any]]
) -> int:
    """Lease an engine, call ``measure`` in a scratch folder, write ``outputs`` atomically.

    ``measure`` returns {"files": {output key: bytes}, "provenance": {...}}. Returns the exit
    code: 0 on success, non-zero with a failure record otherwise."""
    cfg = spec.serving_config
    started_at = now_iso()
    manager = SlotManager(spec.slots)
    engine: EngineLease | None = None
    TMP_DIR.mkdir(parents=True, exist_ok=True)
    prefix = layout.SCRATCH_PREFIX.format(config=cfg.name, cell_id=spec.cell_id, started_s=int(time.time()))
    scratch = Path(tempfile.mkdtemp(prefix=prefix, dir=TMP_DIR))
    try:
        with _signals_interrupt(), manager.lease(cfg) as engine:
            log.info(
                f"{spec.what}: engine {'reused' if engine.reused else 'started'} "
                f"at {engine.base_url} (slot {engine.slot})"
            )
            try:
                measured = measure(spec, engine, scratch)
            except BenchmarkError as err:
                if not manager.is_alive(engine):  # the load generator failed because of it
                    raise _engine_died(spec, manager, engine) from err
                raise
            if not manager.is_alive(engine):
                raise _engine_died(spec, manager, engine)
            record = {
                "schema": provenance.SCHEMA,
                "cell": spec.what,
                "config": cfg.name,
                "fingerprint": cfg.fingerprint(),
                "effective_config": provenance.redact_config(cfg.to_dict()),
                "engine": _engine_record(engine, cfg),
                "host": provenance.host_info(),
                "started_at": started_at,
                "finished_at": now_iso(),
                **measured["provenance"],
            }
            for key, data in measured["files"].items():
                atomic_write_bytes(outputs[key], data)
            atomic_write_json(outputs["provenance"], record)
        spec.failure_path().unlink(missing_ok=True)
        return 0
    except (GridbenchError, _Interrupted, Exception) as caught:
        for path in outputs.values():
            path.unlink(missing_ok=True)  # nothing partial may pass as a result
        err = _disk_full(spec, caught) or caught
        if engine is not None and (
            isinstance(err, EngineError | _Interrupted) or not manager.is_alive(engine)
        ):
            with contextlib.suppress(Exception):
                manager.discard(engine)  # the next cell starts a fresh engine
        _write_failure(spec, err, started_at)
        if not isinstance(err, DiskFullError):  # copies would be truncated, and fill it further
            _keep_scratch(spec, scratch)
        return 130 if isinstance(err, _Interrupted) else getattr(err, "exit_code", 1)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _disk_full(spec: CellSpec, err: BaseException) -> DiskFullError | None:
    """The error, said plainly, when a full disk is its cause: an OSError anywhere in its
    chain, or (a load generator's own write failing) a results filesystem left all but full."""
    hint = (
        f"free space on the filesystem that holds {FAILURE_DIR.parent}/ (df -h {FAILURE_DIR.parent}) "
        "and run the same command again: only the missing cells run"
    )
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno == errno.ENOSPC:
            where = f" writing {cause.filename}" if cause.filename else ""
            return DiskFullError(
                f"{spec.what}: no space left on device{where}; nothing of the cell was kept", hint=hint
            )
        cause = cause.__cause__ or cause.__context__
    try:
        free = shutil.disk_usage(TMP_DIR).free
    except OSError:
        return None
    if free >= _NEARLY_FULL_BYTES:
        return None
    return DiskFullError(
        f"{spec.what}: failed with {free // 1024} KiB left on the filesystem of {FAILURE_DIR.parent}/ "
        f"({err}); nothing of the cell was kept",
        hint=hint,
    )


def _engine_died(spec: CellSpec, manager: SlotManager, engine: EngineLease) -> EngineDiedError:
    return EngineDiedError(
        f"{spec.what}: the engine died while the cell was measuring",
        hint="read the engine log; the next cell starts a fresh engine",
        log_tail=manager.log_tail(engine),
    )


def _keep_scratch(spec: CellSpec, scratch: Path) -> None:
    """Keep what the load generator wrote (progress events, partial JSON) for diagnosis."""
    kept = spec.failure_path().with_suffix("")
    shutil.rmtree(kept, ignore_errors=True)
    if any(scratch.iterdir()):
        try:
            shutil.copytree(scratch, kept)
        except OSError as err:  # a full disk: no half copy either
            shutil.rmtree(kept, ignore_errors=True)
            log.info(f"  the load generator's files were not kept in {kept}: {err}")


def _write_failure(spec: CellSpec, err: BaseException, started_at: str) -> None:
    if isinstance(err, _Interrupted):
        reason = f"{spec.what}: interrupted by {err.args[0]}"
        kind = "interrupted"
    else:
        reason = err.message if isinstance(err, GridbenchError) else f"{spec.what}: {err!r}"
        kind = type(err).__name__
    log_tail = provenance.scrub(getattr(err, "log_tail", "") or "")
    record = {
        "cell": spec.what,
        "config": spec.config["name"],
        "kind": spec.kind,
        "depth": spec.depth,
        "prompt_class": spec.prompt_class,
        "concurrency": spec.concurrency,
        "error_type": kind,
        "reason": provenance.scrub(reason),
        "hint": getattr(err, "hint", None),
        "exit_code": 130 if kind == "interrupted" else getattr(err, "exit_code", 1),
        "engine_log_tail": log_tail,
        "started_at": started_at,
        "failed_at": now_iso(),
        "cell_log": str(spec.log_path()),
    }
    if not isinstance(err, GridbenchError | _Interrupted):
        record["traceback"] = provenance.scrub(traceback.format_exc())
    try:
        atomic_write_json(spec.failure_path(), record)
    except OSError as err:  # e.g. the full disk that failed the cell: its log still says why
        log.info(f"  the failure record {spec.failure_path()} could not be written: {err}")
    log.info(f"FAILED {provenance.scrub(reason)}")
    if record["hint"]:
        log.info(f"  what to do: {record['hint']}")
    if log_tail:
        log.info(f"--- engine log tail ---\n{log_tail}")


def measure_benchy(spec: CellSpec, engine: EngineLease, scratch: Path) -> dict[str, Any]:
    """llama-benchy at the cell's depth, bracketed by spec-decode counter snapshots."""
    cfg = spec.serving_config
    settings = BenchySettings(**spec.benchy)
    cache_reset = probe.reset_prefix_cache(cfg.engine.kind, engine.base_url, engine.headers)
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
        )
        before_own = probe.fetch_metrics(engine.base_url, engine.headers) if post_run else None
        bench_started = now_iso()
        wall_s = benchy.run(run, timeout_s=settings.timeout_s, what=spec.what)
        after = probe.fetch_metrics(engine.base_url, engine.headers) if post_run else None
        try:
            raw = run.result_path.read_bytes()
            result = json.loads(raw)
        except (FileNotFoundError, json.JSONDecodeError) as err:
            raise BenchmarkError(f"{spec.what}: llama-benchy wrote no readable result: {err}") from err
        try:
            entry = benchy.check_result(
                result,
                benchy.read_progress(run.progress_path),
                depth=spec.depth,
                settings=settings,
                what=spec.what,
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
    log.info(
        f"{spec.what}: decode {entry['tg_throughput']['mean']:.2f} tok/s, "
        f"TTFT {entry['e2e_ttft']['mean']:.1f} ms"
    )
    return {
        "files": {"raw": raw},
        "provenance": {
            "versions": provenance.versions("llama-benchy", result.get("version")),
            "bench": {
                "argv": list(run.argv),
                "started_at": bench_started,
                "finished_at": now_iso(),
                "wall_s": round(wall_s, 3),
                "discarded_attempts": attempts,
            },
            "prefix_cache_reset": cache_reset,
            "spec_decode": spec_decode,
        },
    }


def snapshot_command(base_url: str, out_dir: Path, key_variable: str | None) -> str:
    """Shell line for llama-benchy's --post-run-cmd: save /metrics after every run."""
    argv = [sys.executable, "-m", "gridbench.snapshot", f"{base_url}/metrics", str(out_dir.resolve())]
    return shlex.join(argv + ([key_variable] if key_variable else []))


def _acceptance(
    snapshots: Path, before_own: str | None, after: str | None, warmup: bool, what: str
) -> dict[str, Any]:
    files = sorted(snapshots.glob("*.prom"))
    # after llama-benchy's warm-up run comes the first snapshot: the measured window starts there
    before_text = files[0].read_text() if warmup and files else before_own
    if before_text is None or after is None:
        raise BenchmarkError(f"{what}: could not read the engine's /metrics around the measured window")
    result = acceptance(parse_spec_counters(before_text), parse_spec_counters(after))
    result["window"] = "after llama-benchy's warm-up run" if warmup and files else "whole invocation"
    return result


def measure_natural(spec: CellSpec, engine: EngineLease, scratch: Path) -> dict[str, Any]:
    """Warm up, then the measured requests, bracketed by spec-decode counter snapshots."""
    from gridbench.harness import natural  # aiohttp: a quarter second llama-benchy cells skip

    cfg = spec.serving_config
    settings = NaturalSettings.from_dict(spec.natural)
    plan = natural.level_plan(settings, spec.natural["prompt"], spec.concurrency, cfg.bench_extra_body)
    endpoint = natural.Endpoint(engine.base_url, cfg.checkpoint.served_model_name, engine.headers)
    cache_reset = probe.reset_prefix_cache(cfg.engine.kind, engine.base_url, engine.headers)
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
        spec_decode = acceptance(parse_spec_counters(before), parse_spec_counters(after))
        spec_decode["window"] = "the measured requests (after the warm-up requests)"
    document = natural.result_document(
        config=cfg.name, prompt_class=spec.prompt_class, plan=plan, traces=traces, spec_decode=spec_decode
    )
    raw = (json.dumps(document, indent=1, allow_nan=False) + "\n").encode()
    summary = document["summary"]
    if summary["error_rate"] > settings.max_error_rate:
        (scratch / "natural.json").write_bytes(raw)  # kept beside the failure record
        first = next(r["error"] for r in document["requests"] if r["status"] != "ok")
        raise BenchmarkError(
            f"{spec.what}: {summary['errored']} errored and {summary['incomplete']} incomplete of "
            f"{summary['requests']} requests (error rate {summary['error_rate']:.2f} > "
            f"natural.max_error_rate {settings.max_error_rate:g}); first: {first}",
            hint="read the engine log; every request's outcome is in the kept natural.json",
        )
    log.info(
        f"{spec.what}: {summary['output_tok_s']} tok/s aggregate, TTFT p50 {summary['ttft_ms_p50']} ms, "
        f"TPOT p50 {summary['tpot_ms_p50']} ms, {summary['ok']}/{summary['requests']} ok"
    )
    return {
        "files": {"raw": raw},
        "provenance": {
            "versions": provenance.versions(natural.LOAD_GENERATOR, gridbench.__version__),
            "bench": {
                "url": endpoint.url,
                "model": endpoint.model,
                "started_at": started_at,
                "finished_at": now_iso(),
                "wall_s": round(wall_s, 3),
                "harness_processes": plan.processes,
                "warmup": natural.warmup_record(warmups),
            },
            "prefix_cache_reset": cache_reset,
            "spec_decode": spec_decode,
        },
    }


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
