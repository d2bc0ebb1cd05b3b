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
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import gridbench
from gridbench import layout, provenance
from gridbench.engines import probe
from gridbench.engines.events import now_iso
from gridbench.engines.kinds import engine_kind
from gridbench.engines.manager import EngineLease, SlotManager
from gridbench.engines.runtime import ImageInfo
from gridbench.errors import (
    BenchmarkError,
    ConfigError,
    DiskFullError,
    EngineDiedError,
    EngineError,
    GridbenchError,
    ResultFileError,
)
from gridbench.files import JsonObject, atomic_write_bytes, atomic_write_json, atomic_write_text
from gridbench.grid import BenchySettings, Grid, ServingConfig
from gridbench.harness import benchy
from gridbench.harness.prompts import AUTO_PROCESSES, NaturalSettings, resolve_prompts
from gridbench.spec_metrics import Acceptance, acceptance, parse_spec_counters

if TYPE_CHECKING:  # the natural harness imports aiohttp: a quarter second llama-benchy cells skip
    from gridbench.harness.natural import WarmupOutcome

log = logging.getLogger(__name__)

FAILURE_DIR = Path("results/failures")
TMP_DIR = Path(layout.SCRATCH)
# below this, a failed cell is blamed on the disk: a load generator's result is larger
_NEARLY_FULL_BYTES = 1 << 20


CONTEXT_DIR = Path(".gridbench/contexts")


@dataclass(frozen=True)
class BenchyInvocation:
    """How llama-benchy ran for a cell: its command line, its clock, the attempts it discarded."""

    argv: tuple[str, ...]
    started_at: str
    finished_at: str
    wall_s: float
    discarded_attempts: tuple[str, ...]  # why each earlier attempt was measured again

    def to_json(self) -> JsonObject:
        return {
            "argv": list(self.argv),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "wall_s": self.wall_s,
            "discarded_attempts": list(self.discarded_attempts),
        }


@dataclass(frozen=True)
class NaturalInvocation:
    """How the natural harness ran for a cell: where it sent, its clock, its warm-ups."""

    url: str
    model: str
    started_at: str
    finished_at: str
    wall_s: float  # of the measured requests alone
    harness_processes: int
    warmup: tuple[WarmupOutcome, ...]

    def to_json(self) -> JsonObject:
        return {
            "url": self.url,
            "model": self.model,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "wall_s": self.wall_s,
            "harness_processes": self.harness_processes,
            "warmup": [asdict(w) for w in self.warmup],
        }


@dataclass(frozen=True)
class Measured:
    """What a cell's measurement produced: its output files' bytes and its part of the
    cell's provenance record."""

    files: dict[str, bytes]  # by output key ("raw")
    versions: provenance.Versions
    bench: BenchyInvocation | NaturalInvocation
    prefix_cache_reset: bool  # whether the engine's prefix cache was emptied before the cell
    spec_decode: Acceptance | None  # None without speculation


@dataclass(frozen=True)
class CellCoordinates:
    """Where a failed cell sits in the sweep: every kind's coordinates, None where not its own."""

    depth: int | None
    prefix_cache: bool
    prompt_class: str | None
    concurrency: int | None


@dataclass(frozen=True)
class Cell(ABC):
    """One cell of a sweep, as its process runs it: its config (from the context file the
    config's cells share), the engine slots it may use, and its own coordinates."""

    config: ServingConfig  # as the context file holds it
    slots: list[str]

    kind: ClassVar[str]

    @property
    def serving_config(self) -> ServingConfig:
        """The config as the cell's engine serves it."""
        return self.config

    @property
    def name(self) -> str:
        return self.config.name

    @property
    @abstractmethod
    def cell_id(self) -> str: ...

    @property
    @abstractmethod
    def what(self) -> str:
        """How messages name the cell."""

    @abstractmethod
    def files(self) -> layout.CellFiles: ...

    def failure_path(self) -> Path:
        return Path(self.files().failure)

    def log_path(self) -> Path:
        return Path(self.files().log)

    @abstractmethod
    def coordinates(self) -> CellCoordinates: ...

    @abstractmethod
    def measure(self, engine: EngineLease, scratch: Path) -> Measured: ...


@dataclass(frozen=True)
class DepthCell(Cell):
    """llama-benchy at one context depth; with ``prefix_cache``, its prefix-cache pass."""

    depth: int
    benchy: BenchySettings
    prefix_cache: bool = False

    kind: ClassVar[str] = "benchy"

    @property
    def serving_config(self) -> ServingConfig:
        return self.config.with_prefix_cache() if self.prefix_cache else self.config

    @property
    def cell_id(self) -> str:
        return (layout.CACHED_CELL_ID if self.prefix_cache else layout.BENCHY_CELL_ID).format(
            depth=self.depth
        )

    @property
    def what(self) -> str:
        return f"cell {self.name} depth {self.depth}" + (" (cached context)" if self.prefix_cache else "")

    def files(self) -> layout.CellFiles:
        return layout.depth_cell_files(self.name, self.depth, prefix_cache=self.prefix_cache)

    def coordinates(self) -> CellCoordinates:
        return CellCoordinates(
            depth=self.depth, prefix_cache=self.prefix_cache, prompt_class=None, concurrency=None
        )

    def measure(self, engine: EngineLease, scratch: Path) -> Measured:
        return measure_benchy(self, engine, scratch)


@dataclass(frozen=True)
class NaturalCell(Cell):
    """One prompt class at one concurrency, through gridbench's own harness."""

    prompt_class: str
    concurrency: int
    natural: NaturalSettings
    prompt: str  # the class's prompt string

    kind: ClassVar[str] = "natural"

    @property
    def cell_id(self) -> str:
        return layout.NATURAL_CELL_ID.format(prompt_class=self.prompt_class, concurrency=self.concurrency)

    @property
    def what(self) -> str:
        return f"cell {self.name} {self.prompt_class} c={self.concurrency}"

    def files(self) -> layout.CellFiles:
        return layout.natural_cell_files(self.name, self.prompt_class, self.concurrency)

    def coordinates(self) -> CellCoordinates:
        return CellCoordinates(
            depth=None, prefix_cache=False, prompt_class=self.prompt_class, concurrency=self.concurrency
        )

    def measure(self, engine: EngineLease, scratch: Path) -> Measured:
        return measure_natural(self, engine, scratch)


def load_depth_cell(context: Path, depth: int, *, prefix_cache: bool = False) -> DepthCell:
    """The cell a ``gridbench bench`` process runs: its config's context file, its depth."""
    shared = json.loads(Path(context).read_text())
    return DepthCell(
        config=ServingConfig.from_dict(shared["config"]),
        slots=shared["slots"],
        depth=depth,
        benchy=BenchySettings(**shared["benchy"]),
        prefix_cache=prefix_cache,
    )


def load_natural_cell(context: Path, prompt_class: str, concurrency: int) -> NaturalCell:
    """The cell a ``gridbench natural`` process runs: the context holds every class's prompt."""
    shared = json.loads(Path(context).read_text())
    return NaturalCell(
        config=ServingConfig.from_dict(shared["config"]),
        slots=shared["slots"],
        prompt_class=prompt_class,
        concurrency=concurrency,
        natural=NaturalSettings.from_dict(shared["natural"]),
        prompt=shared["natural"]["prompts"][prompt_class],
    )


def write_context(grid: Grid, config: str, slots: list[str], kind: str) -> Path:
    """What one config's cells of one kind share, in a file named by its content: a cell's
    params (the path) change exactly when what it measures changes. Natural contexts carry
    the prompt strings themselves, so an edited prompt file reruns its cells."""
    context: JsonObject = {"config": grid.config_dict(config), "slots": slots}
    if kind == "benchy":
        context["benchy"] = asdict(grid.benchy)
    elif grid.natural is None:
        raise ConfigError(f"config {config}: the grid has no natural section, so no natural cells")
    else:
        prompts = resolve_prompts(grid.natural)
        # the section as written (defaults filled): the context's bytes name its cells' params
        context["natural"] = {**grid.document["natural"], "prompts": prompts}
        if context["natural"]["processes"] == AUTO_PROCESSES:
            # it changes how many requests fit, not what a cell measures: the default keeps
            # the contexts (the cells' params) of studies measured before the key existed
            del context["natural"]["processes"]
    text = json.dumps(context, sort_keys=True, separators=(",", ":"))
    path = CONTEXT_DIR / f"{config}-{kind}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.json"
    if not path.exists():
        atomic_write_text(path, text)
    return path


def depth_cell(
    grid: Grid, config: str, slots: list[str], depth: int, *, prefix_cache: bool = False
) -> DepthCell:
    """A depth cell as its process will read it, its context file written (tests, tools)."""
    return load_depth_cell(write_context(grid, config, slots, "benchy"), depth, prefix_cache=prefix_cache)


def natural_cell(
    grid: Grid, config: str, slots: list[str], prompt_class: str, concurrency: int
) -> NaturalCell:
    """A natural cell as its process will read it, its context file written (tests, tools)."""
    return load_natural_cell(write_context(grid, config, slots, "natural"), prompt_class, concurrency)


class _Interrupted(BaseException):
    """SIGTERM/SIGINT reached the cell: clean up, write nothing, exit non-zero."""


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    def handler(signum: int, _frame: object) -> None:
        raise _Interrupted(signal.Signals(signum).name)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@dataclass(frozen=True)
class EngineRecord:
    """The engine that measured a cell, for its provenance record."""

    kind: str
    runtime: str
    image: ImageInfo
    version: str | None
    serve_argv: tuple[str, ...]
    serve_command: str
    base_url: str
    slot: str
    slots: tuple[str, ...]
    gpus: tuple[provenance.SlotGpu, ...]  # each slot's GPU; none without NVIDIA GPUs
    started_at: str
    startup_s: float | None
    reused: bool

    def to_json(self) -> JsonObject:
        return {
            "kind": self.kind,
            "runtime": self.runtime,
            **self.image.to_json(),
            "version": self.version,
            "serve_argv": list(self.serve_argv),
            "serve_command": self.serve_command,
            "base_url": self.base_url,
            "slot": self.slot,
            "slots": list(self.slots),
            "gpus": [asdict(gpu) for gpu in self.gpus],
            "started_at": self.started_at,
            "startup_s": self.startup_s,
            "reused": self.reused,
        }


def _engine_record(engine: EngineLease, cfg: ServingConfig) -> EngineRecord:
    return EngineRecord(
        kind=cfg.engine.kind,
        runtime=cfg.engine.runtime,
        image=engine.image,
        version=engine.version,
        serve_argv=tuple(engine.plan.argv),
        serve_command=engine.plan.shell_line(),
        base_url=engine.base_url,
        slot=engine.slot,
        slots=engine.slots,
        gpus=tuple(provenance.slot_gpus(engine.slots)),
        started_at=engine.started_at,
        startup_s=engine.ready_s,
        reused=engine.reused,
    )


@dataclass(frozen=True)
class CellProvenance:
    """A cell's provenance file: what measured it (engine, load generator), where, and when."""

    cell: str  # how messages name the cell
    config: ServingConfig  # as the cell's engine served it
    engine: EngineRecord
    host: provenance.HostInfo
    started_at: str
    finished_at: str
    versions: provenance.Versions
    # None only in the report fixtures' natural records (aggregate/synthetic.py), which have no bench
    bench: BenchyInvocation | NaturalInvocation | None
    prefix_cache_reset: bool  # whether the engine's prefix cache was emptied before the cell
    spec_decode: Acceptance | None  # None without speculation

    def to_json(self) -> JsonObject:
        return {
            "schema": provenance.SCHEMA,
            "cell": self.cell,
            "config": self.config.name,
            "fingerprint": self.config.fingerprint(),
            "effective_config": provenance.redact_config(self.config.to_dict()),
            "engine": self.engine.to_json(),
            "host": self.host.to_json(),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "versions": asdict(self.versions),
            **({"bench": self.bench.to_json()} if self.bench else {}),
            "prefix_cache_reset": self.prefix_cache_reset,
            "spec_decode": self.spec_decode.to_json() if self.spec_decode else None,
        }


@dataclass(frozen=True)
class FailureRecord:
    """A failed cell's record under ``results/failures/``: where it sits, why, what to do."""

    cell: str  # how messages name the cell
    config: str
    kind: str  # the cell's kind: "benchy" or "natural"
    coordinates: CellCoordinates
    error_type: str  # the error's class name, or "interrupted"
    reason: str
    hint: str | None
    exit_code: int
    engine_log_tail: str
    started_at: str
    failed_at: str
    cell_log: str
    traceback: str | None = None  # only for an error gridbench did not raise itself

    def to_json(self) -> JsonObject:
        record: JsonObject = {
            "cell": self.cell,
            "config": self.config,
            "kind": self.kind,
            **asdict(self.coordinates),
            "error_type": self.error_type,
            "reason": self.reason,
            "hint": self.hint,
            "exit_code": self.exit_code,
            "engine_log_tail": self.engine_log_tail,
            "started_at": self.started_at,
            "failed_at": self.failed_at,
            "cell_log": self.cell_log,
        }
        if self.traceback is not None:
            record["traceback"] = self.traceback
        return record


def run_cell(spec: Cell, outputs: dict[str, Path]) -> int:
    """Lease an engine, measure the cell in a scratch folder, write ``outputs`` atomically.

    Returns the exit code: 0 on success, non-zero with a failure record otherwise."""
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
                measured = spec.measure(engine, scratch)
            except BenchmarkError as err:
                if not manager.is_alive(engine):  # the load generator failed because of it
                    raise _engine_died(spec, manager, engine) from err
                raise
            if not manager.is_alive(engine):
                raise _engine_died(spec, manager, engine)
            record = CellProvenance(
                cell=spec.what,
                config=cfg,
                engine=_engine_record(engine, cfg),
                host=provenance.host_info(),
                started_at=started_at,
                finished_at=now_iso(),
                versions=measured.versions,
                bench=measured.bench,
                prefix_cache_reset=measured.prefix_cache_reset,
                spec_decode=measured.spec_decode,
            )
            for key, data in measured.files.items():
                atomic_write_bytes(outputs[key], data)
            atomic_write_json(outputs["provenance"], record.to_json())
        spec.failure_path().unlink(missing_ok=True)
        return 0
    except (GridbenchError, _Interrupted, Exception) as caught:
        for path in outputs.values():
            path.unlink(missing_ok=True)  # nothing partial may pass as a result
        failure = _disk_full(spec, caught) or caught
        if engine is not None and (
            isinstance(failure, EngineError | _Interrupted) or not manager.is_alive(engine)
        ):
            with contextlib.suppress(Exception):
                manager.discard(engine)  # the next cell starts a fresh engine
        _write_failure(spec, failure, started_at)
        if not isinstance(failure, DiskFullError):  # copies would be truncated, and fill it further
            _keep_scratch(spec, scratch)
        return 130 if isinstance(failure, _Interrupted) else getattr(failure, "exit_code", 1)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _disk_full(spec: Cell, err: BaseException) -> DiskFullError | None:
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


def _engine_died(spec: Cell, manager: SlotManager, engine: EngineLease) -> EngineDiedError:
    return EngineDiedError(
        f"{spec.what}: the engine died while the cell was measuring",
        hint="read the engine log; the next cell starts a fresh engine",
        log_tail=manager.log_tail(engine),
    )


def _keep_scratch(spec: Cell, scratch: Path) -> None:
    """Keep what the load generator wrote (progress events, partial JSON) for diagnosis."""
    kept = spec.failure_path().with_suffix("")
    shutil.rmtree(kept, ignore_errors=True)
    if any(scratch.iterdir()):
        try:
            shutil.copytree(scratch, kept)
        except OSError as err:  # a full disk: no half copy either
            shutil.rmtree(kept, ignore_errors=True)
            log.info(f"  the load generator's files were not kept in {kept}: {err}")


def _write_failure(spec: Cell, err: BaseException, started_at: str) -> None:
    if isinstance(err, _Interrupted):
        reason = f"{spec.what}: interrupted by {err.args[0]}"
        kind = "interrupted"
    else:
        reason = err.message if isinstance(err, GridbenchError) else f"{spec.what}: {err!r}"
        kind = type(err).__name__
    log_tail = provenance.scrub(getattr(err, "log_tail", "") or "")
    record = FailureRecord(
        cell=spec.what,
        config=spec.name,
        kind=spec.kind,
        coordinates=spec.coordinates(),
        error_type=kind,
        reason=provenance.scrub(reason),
        hint=getattr(err, "hint", None),
        exit_code=130 if kind == "interrupted" else getattr(err, "exit_code", 1),
        engine_log_tail=log_tail,
        started_at=started_at,
        failed_at=now_iso(),
        cell_log=str(spec.log_path()),
        traceback=(
            None
            if isinstance(err, GridbenchError | _Interrupted)
            else provenance.scrub(traceback.format_exc())
        ),
    )
    try:
        atomic_write_json(spec.failure_path(), record.to_json())
    except OSError as err:  # e.g. the full disk that failed the cell: its log still says why
        log.info(f"  the failure record {spec.failure_path()} could not be written: {err}")
    log.info(f"FAILED {provenance.scrub(reason)}")
    if record.hint:
        log.info(f"  what to do: {record.hint}")
    if log_tail:
        log.info(f"--- engine log tail ---\n{log_tail}")


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
    plan = natural.level_plan(settings, spec.prompt, spec.concurrency, cfg.bench_extra_body)
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
    raw = (json.dumps(result.to_json(), indent=1, allow_nan=False) + "\n").encode()
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
            warmup=natural.warmup_outcomes(warmups),
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
