"""One cell, end to end: lease a ready engine, measure, check, and write the result.

A cell either writes its result files complete (atomically) or writes none and leaves a
failure record under ``results/failures/`` instead; a later success removes the record.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import shutil
import signal
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

from gridbench import layout
from gridbench.assets.manifest import manifest_entries
from gridbench.cells import provenance
from gridbench.cells.kinds import Cell
from gridbench.cells.records import CellProvenance, EngineRecord, FailureRecord, Measured
from gridbench.cells.telemetry import NvmlSampler, Telemetry
from gridbench.engines.events import now_iso
from gridbench.engines.manager import EngineLease, SlotManager
from gridbench.errors import (
    BenchmarkError,
    DiskFullError,
    EngineDiedError,
    EngineError,
    GridbenchError,
)
from gridbench.util import codec
from gridbench.util.files import atomic_write_bytes, atomic_write_json

log = logging.getLogger(__name__)

FAILURE_DIR = Path("results/failures")
TMP_DIR = Path(layout.SCRATCH)
# below this, a failed cell is blamed on the disk: a load generator's result is larger
_NEARLY_FULL_BYTES = 1 << 20


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
        with _signals_interrupt(), manager.lease(cfg, fresh=spec.needs_fresh_engine) as engine:
            log.info(
                f"{spec.what}: engine {'reused' if engine.reused else 'started'} "
                f"at {engine.base_url} (slot {engine.slot})"
            )
            try:
                with NvmlSampler([gpu.uuid for gpu in provenance.slot_gpus(engine.slots)]) as sampler:
                    measured = spec.measure(engine, scratch)
            except BenchmarkError as err:
                if not manager.is_alive(engine):  # the load generator failed because of it
                    raise _engine_died(spec, manager, engine) from err
                raise
            if not manager.is_alive(engine):
                raise _engine_died(spec, manager, engine)
            series = Path(layout.telemetry_series(str(outputs["provenance"])))
            record = _provenance(spec, engine, started_at, measured, sampler.telemetry(series))
            for key, data in measured.files.items():
                atomic_write_bytes(outputs[key], data)
            atomic_write_json(outputs["provenance"], codec.to_json(record))
        spec.failure_path().unlink(missing_ok=True)
        return 0
    except (GridbenchError, _Interrupted, Exception) as caught:
        for path in outputs.values():
            path.unlink(missing_ok=True)  # nothing partial may pass as a result
        Path(layout.telemetry_series(str(outputs["provenance"]))).unlink(missing_ok=True)
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


def _provenance(
    spec: Cell, engine: EngineLease, started_at: str, measured: Measured, telemetry: Telemetry
) -> CellProvenance:
    """The provenance record of a cell ``engine`` served and ``spec.measure`` measured."""
    cfg = spec.serving_config
    return CellProvenance(
        cell=spec.what,
        config=cfg.name,
        fingerprint=cfg.fingerprint(),
        effective_config=codec.to_json(provenance.redact_config(cfg)),
        engine=EngineRecord.from_lease(engine, cfg),
        host=provenance.host_info(),
        started_at=started_at,
        finished_at=now_iso(),
        versions=measured.versions,
        bench=measured.bench,
        prefix_cache_reset=measured.prefix_cache_reset,
        spec_decode=measured.spec_decode,
        weights=manifest_entries(cfg.weight_files),
        telemetry=telemetry,
    )


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
        atomic_write_json(spec.failure_path(), codec.to_json(record))
    except OSError as err:  # e.g. the full disk that failed the cell: its log still says why
        log.info(f"  the failure record {spec.failure_path()} could not be written: {err}")
    log.info(f"FAILED {provenance.scrub(reason)}")
    if record.hint:
        log.info(f"  what to do: {record.hint}")
    if log_tail:
        log.info(f"--- engine log tail ---\n{log_tail}")
