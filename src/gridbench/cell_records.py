"""What a cell writes: its provenance record beside a result, or its failure record instead;
each record's ``to_json`` is its file's part, byte for byte what the datasets read back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from gridbench import provenance
from gridbench.engines.runtime import ImageInfo
from gridbench.files import JsonObject
from gridbench.grid import ServingConfig
from gridbench.spec_metrics import Acceptance

if TYPE_CHECKING:  # annotations only: reading and writing records needs no engine or harness
    from gridbench.engines.manager import EngineLease
    from gridbench.harness.natural import WarmupOutcome


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

    @classmethod
    def from_lease(cls, engine: EngineLease, cfg: ServingConfig) -> EngineRecord:
        """The leased engine that served ``cfg``, as the provenance record names it."""
        return cls(
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
