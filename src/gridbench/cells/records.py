"""What a cell writes: its provenance record beside a result, or its failure record instead;
each record's fields are its file's keys (written by gridbench.util.codec), and the datasets
read the same records back. ``current_provenance`` is the one place that upgrades a provenance
file of an older format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gridbench.assets.manifest import ModelFile
from gridbench.cells import provenance
from gridbench.cells.telemetry import Telemetry
from gridbench.config.grid import ServingConfig
from gridbench.engines.compile_cache import CompileCache
from gridbench.engines.runtime import ImageInfo
from gridbench.engines.spec_metrics import Acceptance
from gridbench.errors import ResultFileError
from gridbench.harness.stats import WarmupOutcome
from gridbench.util import codec
from gridbench.util.files import JsonObject

if TYPE_CHECKING:  # annotations only: reading and writing records needs no engine
    from gridbench.engines.manager import EngineLease


@dataclass(frozen=True)
class BenchyInvocation:
    """How llama-benchy ran for a cell: its command line, its clock, the attempts it discarded."""

    argv: tuple[str, ...]
    started_at: str
    finished_at: str
    wall_s: float
    discarded_attempts: tuple[str, ...]  # why each earlier attempt was measured again


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


@dataclass(frozen=True)
class QualityInvocation:
    """How a quality cell's greedy requests ran: where they went, one at a time, and its clock."""

    url: str
    model: str
    started_at: str
    finished_at: str
    wall_s: float
    greedy_requests: int  # one per prompt; the provenance's key that no other invocation has


@dataclass(frozen=True)
class LoadInvocation:
    """How a load cell's open loop ran: where it sent, its clock, its warm-ups, its schedule."""

    url: str
    model: str
    started_at: str
    finished_at: str
    wall_s: float  # of the scheduled requests alone
    warmup: tuple[WarmupOutcome, ...]
    schedule_seed: int  # load.seed; the provenance's key that no other invocation has
    # the loops the schedule was dealt across; left out when one, as before the key existed
    harness_processes: int = field(default=1, metadata=codec.OMITTED_WHEN_DEFAULT)


@dataclass(frozen=True)
class SessionInvocation:
    """How a session cell's conversations ran: where they went, its clock, its warm-ups."""

    url: str
    model: str
    started_at: str
    finished_at: str
    wall_s: float  # of the conversations alone
    warmup: tuple[WarmupOutcome, ...]
    concurrent_sessions: int  # the provenance's key that no other invocation has


@dataclass(frozen=True)
class Measured:
    """What a cell's measurement produced: its output files' bytes and its part of the
    cell's provenance record."""

    files: dict[str, bytes]  # by output key ("raw")
    versions: provenance.Versions
    bench: BenchyInvocation | NaturalInvocation | QualityInvocation | LoadInvocation | SessionInvocation
    prefix_cache_reset: bool  # whether the engine's prefix cache was emptied before the cell
    spec_decode: Acceptance | None  # None without speculation


@dataclass(frozen=True)
class CellCoordinates:
    """Where a failed cell sits in the sweep: every kind's coordinates, None where not its own."""

    depth: int | None
    prefix_cache: bool
    prompt_class: str | None
    concurrency: int | None
    # a load cell's; the other kinds' failure records keep the keys they had
    arrival: str | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)
    rate_req_s: float | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)
    sessions: int | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)  # a session cell's


@dataclass(frozen=True)
class EngineRecord:
    """The engine that measured a cell, for its provenance record."""

    kind: str
    runtime: str
    image: ImageInfo = field(metadata=codec.INLINE)  # its keys among the engine's
    version: str | None
    serve_argv: tuple[str, ...]
    serve_command: str
    base_url: str
    slot: str
    slots: tuple[str, ...]
    # each slot's GPU; none without NVIDIA GPUs; None in a v1 record that did not list them
    gpus: tuple[provenance.SlotGpu, ...] | None
    started_at: str
    startup_s: float | None
    reused: bool
    # its start's compile cache: found warm ("hit") or not ("miss"); absent for a kind without one
    compile_cache: CompileCache | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)

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
            compile_cache=engine.compile_cache,
        )


@dataclass(frozen=True, kw_only=True)
class CellProvenance:
    """A cell's provenance file: what measured it (engine, load generator), where, and when."""

    schema: str = provenance.SCHEMA
    cell: str  # how messages name the cell
    config: str  # the config's name
    fingerprint: str  # ServingConfig.fingerprint: the engine it names
    # the ServingConfig its engine served, secrets redacted, kept as the document it was
    # written as: an archive of what ran, which a later gridbench's config records need not fit
    effective_config: JsonObject
    engine: EngineRecord
    host: provenance.HostInfo
    started_at: str
    finished_at: str
    versions: provenance.Versions
    # None only in the report fixtures' natural records (tests/synthetic.py), which have no bench
    bench: (
        BenchyInvocation | NaturalInvocation | QualityInvocation | LoadInvocation | SessionInvocation | None
    ) = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)
    prefix_cache_reset: bool  # whether the engine's prefix cache was emptied before the cell
    spec_decode: Acceptance | None  # None without speculation
    # the served files an asset step listed in its MANIFEST.json: package, version, sha256
    weights: tuple[ModelFile, ...] = field(default=(), metadata=codec.OMITTED_WHEN_DEFAULT)
    # the GPUs over the measurement (cells.telemetry); absent in records older than it
    telemetry: Telemetry | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)


# v1 (no version of its own while keys were added): an engine may lack ``slots`` and ``gpus``,
# a natural invocation ``harness_processes``
PROVENANCE_V1 = "gridbench.provenance.v1"


def current_provenance(document: object) -> object:
    """A provenance file's parsed document in the current format (``provenance.SCHEMA``): a
    v1 document upgraded, a current one as it is, anything else refused with ResultFileError
    (a document that is no JSON object is left for the reader to refuse)."""
    if not isinstance(document, dict):
        return document
    schema = document.get("schema")
    if schema == provenance.SCHEMA:
        return document
    if schema != PROVENANCE_V1:
        raise ResultFileError(f"not a provenance record this gridbench reads (schema {schema!r})")
    upgraded = {**document, "schema": provenance.SCHEMA}
    engine = document.get("engine")
    if isinstance(engine, dict):
        # before engines spanned slots, an engine held one; its GPUs were not listed
        upgraded["engine"] = {"slots": [engine.get("slot")], "gpus": None, **engine}
    bench = document.get("bench")
    if isinstance(bench, dict) and "warmup" in bench and "schedule_seed" not in bench:
        upgraded["bench"] = {"harness_processes": 1, **bench}  # the natural harness ran in one then
    return upgraded


@dataclass(frozen=True)
class FailureRecord:
    """A failed cell's record under ``results/failures/``: where it sits, why, what to do."""

    cell: str  # how messages name the cell
    config: str
    kind: str  # the cell's kind: "benchy", "natural", "quality" or "load"
    coordinates: CellCoordinates = field(metadata=codec.INLINE)
    error_type: str  # the error's class name, or "interrupted"
    reason: str
    hint: str | None
    exit_code: int
    engine_log_tail: str
    started_at: str
    failed_at: str
    cell_log: str
    # only for an error gridbench did not raise itself
    traceback: str | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)


def current_failure(document: object) -> object:
    """A failure file's parsed document in the current format: one written before the
    prefix-cache pass lacks ``prefix_cache`` (none of its cells was such a pass's)."""
    if isinstance(document, dict) and "prefix_cache" not in document:
        return {**document, "prefix_cache": False}
    return document
