"""One cell, end to end: lease a ready engine, measure, check, and write the result.

A cell either writes its result files complete (atomically) or writes none and leaves a
failure record under ``results/failures/`` instead; a later success removes the record.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shlex
import shutil
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gridbench import provenance
from gridbench.engines import probe
from gridbench.engines.manager import EngineLease, SlotManager, now_iso
from gridbench.errors import BenchmarkError, EngineDiedError, EngineError, GridbenchError
from gridbench.files import atomic_write_bytes, atomic_write_json
from gridbench.grid import BenchySettings, Grid, ServingConfig
from gridbench.harness import benchy
from gridbench.spec_metrics import acceptance, parse_spec_counters

log = logging.getLogger(__name__)

FAILURE_DIR = Path("results/failures")
TMP_DIR = Path("results/.tmp")


@dataclass(frozen=True)
class CellSpec:
    """Everything a cell process needs, passed by the workflow as one JSON string."""

    kind: str  # "benchy" or "natural"
    config: dict[str, Any]  # ServingConfig.to_dict()
    slots: list[str]
    depth: int | None = None
    benchy: dict[str, Any] | None = None
    prompt_class: str | None = None
    concurrency: int | None = None
    natural: dict[str, Any] | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> CellSpec:
        return cls(**json.loads(text))

    @property
    def serving_config(self) -> ServingConfig:
        return ServingConfig.from_dict(self.config)

    @property
    def cell_id(self) -> str:
        if self.kind == "benchy":
            return f"depth_{self.depth}"
        return f"{self.prompt_class}_c{self.concurrency}"

    @property
    def what(self) -> str:
        name = self.config["name"]
        if self.kind == "benchy":
            return f"cell {name} depth {self.depth}"
        return f"cell {name} {self.prompt_class} c={self.concurrency}"

    def failure_path(self) -> Path:
        sub = "" if self.kind == "benchy" else "natural/"
        return FAILURE_DIR / sub / self.config["name"] / f"{self.cell_id}.json"


def benchy_cell_spec(grid: Grid, config: str, depth: int, slots: list[str]) -> CellSpec:
    return CellSpec(
        kind="benchy",
        config=grid.configs[config].to_dict(),
        slots=slots,
        depth=depth,
        benchy=asdict(grid.benchy),
    )


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
    scratch = Path(tempfile.mkdtemp(prefix=f"{cfg.name}-{spec.cell_id}-", dir=TMP_DIR))
    try:
        with _signals_interrupt(), manager.lease(cfg) as engine:
            log.info(
                f"{spec.what}: engine {'reused' if engine.reused else 'started'} "
                f"at {engine.base_url} (slot {engine.slot})"
            )
            measured = measure(spec, engine, scratch)
            if not manager.is_alive(engine):
                raise EngineDiedError(
                    f"{spec.what}: the engine died while the cell was measuring",
                    hint="read the engine log; the next cell starts a fresh engine",
                    log_tail=manager.log_tail(engine),
                )
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
    except (GridbenchError, _Interrupted, Exception) as err:
        for path in outputs.values():
            path.unlink(missing_ok=True)  # nothing partial may pass as a result
        if engine is not None and (
            isinstance(err, EngineError | _Interrupted) or not manager.is_alive(engine)
        ):
            with contextlib.suppress(Exception):
                manager.discard(engine)  # the next cell starts a fresh engine
        _write_failure(spec, err, started_at)
        _keep_scratch(spec, scratch)
        return 130 if isinstance(err, _Interrupted) else getattr(err, "exit_code", 1)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _keep_scratch(spec: CellSpec, scratch: Path) -> None:
    """Keep what the load generator wrote (progress events, partial JSON) for diagnosis."""
    kept = spec.failure_path().with_suffix("")
    shutil.rmtree(kept, ignore_errors=True)
    if any(scratch.iterdir()):
        shutil.copytree(scratch, kept)


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
        "cell_log": f"logs/cells/{spec.config['name']}/{spec.cell_id}.log",
    }
    if not isinstance(err, GridbenchError | _Interrupted):
        record["traceback"] = provenance.scrub(traceback.format_exc())
    atomic_write_json(spec.failure_path(), record)
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
    post_run = snapshot_command(engine.base_url, snapshots) if cfg.speculation.enabled else None
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
        except benchy.TransportError as err:
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
                "argv": benchy.redacted_argv(run),
                "started_at": bench_started,
                "finished_at": now_iso(),
                "wall_s": round(wall_s, 3),
                "discarded_attempts": attempts,
            },
            "prefix_cache_reset": cache_reset,
            "spec_decode": spec_decode,
        },
    }


def snapshot_command(base_url: str, out_dir: Path) -> str:
    """Shell line for llama-benchy's --post-run-cmd: save /metrics after every run."""
    return shlex.join(
        [sys.executable, "-m", "gridbench.snapshot", f"{base_url}/metrics", str(out_dir.resolve())]
    )


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
