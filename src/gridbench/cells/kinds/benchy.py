"""llama-benchy at one context depth (kind "benchy"), and its prefix-cache pass (kind
"benchy-cached": the same depth with llama-benchy's two-phase mode, on the config's engine
with its prefix cache on). Both are bracketed by the engine's spec-decode counters when the
config speculates."""

from __future__ import annotations

import json
import logging
import shlex
import shutil
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from gridbench.cells import provenance
from gridbench.cells.kinds.base import (
    Cell,
    CellKind,
    CellPatterns,
    KindPlan,
    PlannedCell,
    RequestProgress,
    Skipped,
    json_lines,
)
from gridbench.cells.records import BenchyInvocation, CellCoordinates, Measured
from gridbench.config.grid import BenchySettings, Grid, ServingConfig
from gridbench.engines import probe
from gridbench.engines.events import now_iso
from gridbench.engines.kinds import engine_kind
from gridbench.engines.spec_metrics import Acceptance, acceptance, parse_spec_counters
from gridbench.errors import BenchmarkError, ResultFileError
from gridbench.harness import benchy
from gridbench.layout import CellFiles
from gridbench.util import codec

if TYPE_CHECKING:
    from gridbench.engines.manager import EngineLease

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class DepthCellPlan(PlannedCell):
    """A llama-benchy cell of the plan."""

    depth: int

    kind: ClassVar[str] = "benchy"

    @property
    def key(self) -> tuple[str, int]:
        return self.config, self.depth

    @property
    def cell_id(self) -> str:
        return BENCHY.patterns.cell_id.format(depth=self.depth)

    @property
    def label(self) -> str:
        return f"{self.config} depth {self.depth}"

    @property
    def timing_keys(self) -> tuple[tuple[str | int, ...], ...]:
        return ("benchy", self.config, self.depth), ("benchy", self.depth), ("benchy",)


@dataclass(frozen=True, kw_only=True)
class CachedCellPlan(DepthCellPlan):
    """A prefix-cache pass's cell of the plan: the same depth, its context cached."""

    kind: ClassVar[str] = "benchy-cached"

    @property
    def cell_id(self) -> str:
        return CACHED.patterns.cell_id.format(depth=self.depth)

    @property
    def label(self) -> str:
        return f"{self.config} depth {self.depth} cached"

    @property
    def timing_keys(self) -> tuple[tuple[str | int, ...], ...]:
        return ("cached", self.config, self.depth), ("cached", self.depth), ("cached",)


@dataclass(frozen=True)
class DepthCell(Cell):
    """llama-benchy at one context depth; with ``prefix_cache``, its prefix-cache pass."""

    depth: int
    benchy: BenchySettings
    prefix_cache: bool = False

    kind: ClassVar[str] = "benchy"

    @property
    def cell_kind(self) -> BenchyKind:
        return CACHED if self.prefix_cache else BENCHY

    @property
    def serving_config(self) -> ServingConfig:
        return self.config.with_prefix_cache() if self.prefix_cache else self.config

    @property
    def cell_id(self) -> str:
        return self.cell_kind.patterns.cell_id.format(depth=self.depth)

    @property
    def what(self) -> str:
        return f"cell {self.name} depth {self.depth}" + (" (cached context)" if self.prefix_cache else "")

    def files(self) -> CellFiles:
        return self.cell_kind.patterns.files(config=self.name, depth=self.depth)

    def coordinates(self) -> CellCoordinates:
        return CellCoordinates(
            depth=self.depth, prefix_cache=self.prefix_cache, prompt_class=None, concurrency=None
        )

    def measure(self, engine: EngineLease, scratch: Path) -> Measured:
        return measure_benchy(self, engine, scratch)


@dataclass(frozen=True)
class DepthContext:
    """A context file of one config's depth cells (both passes): what they share."""

    config: ServingConfig
    slots: list[str]
    benchy: BenchySettings


@dataclass(frozen=True)
class BenchyEvent:
    """One line of llama-benchy's --emit-progress file, the keys progress reads (the others
    describe requests as they start and stream)."""

    type: str  # "request_end" once a request ended
    error: str | None = None  # empty or None when it succeeded
    total_tokens: int | None = None  # the tokens it generated
    decode_seconds: float | None = None


def too_long(grid: Grid, config: ServingConfig, depth: int) -> str | None:
    """Why a depth's prompt does not fit the config's context, or None when it does."""
    needed = depth + grid.benchy.pp + grid.benchy.tg
    if needed <= config.serving.max_model_len:
        return None
    return (
        f"depth {depth} + pp {grid.benchy.pp} + tg {grid.benchy.tg} = {needed} "
        f"exceeds max_model_len {config.serving.max_model_len}"
    )


class BenchyKind(CellKind[DepthCellPlan]):
    """llama-benchy cells: config-major, then depth; a depth too long for a config is skipped."""

    name: ClassVar[str] = "benchy"
    context_name: ClassVar[str] = "benchy"
    patterns: ClassVar[CellPatterns] = CellPatterns(
        raw="results/raw/{config}/depth_{depth}.json",
        provenance="results/raw/{config}/depth_{depth}.provenance.json",
        failure="results/failures/{config}/depth_{depth}.json",
        log="logs/cells/{config}/depth_{depth}.log",
        cell_id="depth_{depth}",
    )
    wildcard_names: ClassVar[tuple[str, ...]] = ("depth",)
    progress_file: ClassVar[str] = benchy.PROGRESS_FILE
    dataset: ClassVar[str] = "depth"  # the prefix-cache pass's: its rows' cached columns

    def planned(self, grid: Grid, config: str, depth: int) -> DepthCellPlan:
        files = self.patterns.files(config=config, depth=depth)
        return DepthCellPlan(
            config=config, depth=depth, files=files, expected_requests=self.expected_requests(grid)
        )

    def plan(self, grid: Grid, configs: Sequence[ServingConfig]) -> KindPlan[DepthCellPlan]:
        cells: list[DepthCellPlan] = []
        skipped: list[Skipped[DepthCellPlan]] = []
        for config in configs:
            for depth in grid.depths:
                reason = too_long(grid, config, depth)
                if reason is None:
                    cells.append(self.planned(grid, config.name, depth))
                else:
                    skipped.append(Skipped(self.planned(grid, config.name, depth), reason))
        return KindPlan(tuple(cells), tuple(skipped))

    def wildcard_patterns(self, grid: Grid) -> dict[str, str]:
        return {"depth": r"\d+"}

    def coordinate_ranks(self, grid: Grid) -> dict[tuple[str, ...], int]:
        return {(str(depth),): rank for rank, depth in enumerate(grid.depths)}

    def host_files(self, grid: Grid, config: str) -> list[str]:
        return [*grid.configs[config].files, grid.benchy.corpus]

    def context(self, grid: Grid, config: str, slots: list[str]) -> DepthContext:
        return DepthContext(config=grid.configs[config], slots=slots, benchy=grid.benchy)

    def load(self, context: Path, wildcards: Mapping[str, str]) -> DepthCell:
        shared = codec.from_json(DepthContext, json.loads(Path(context).read_text()))
        return DepthCell(
            config=shared.config,
            slots=shared.slots,
            depth=int(wildcards["depth"]),
            benchy=shared.benchy,
            prefix_cache=self is CACHED,
        )

    def expected_requests(self, grid: Grid) -> int:
        """The measured requests llama-benchy sends for one cell."""
        return grid.benchy.runs * grid.benchy.concurrency

    def requests(self, text: str, expected: int) -> RequestProgress:
        ended = [e for e in json_lines(BenchyEvent, text) if e.type == "request_end"]
        rates = [
            e.total_tokens / e.decode_seconds
            for e in ended
            if not e.error and e.total_tokens and e.decode_seconds
        ]
        return RequestProgress(
            load_generator="llama-benchy",
            phase="measured",
            requests_done=len(ended),
            requests_expected=expected,
            requests_failed=sum(1 for e in ended if e.error),
            tok_s=statistics.mean(rates) if rates else None,
            tok_s_meaning="decode per request",
        )


class CachedKind(BenchyKind):
    """The prefix-cache pass (benchy.prefix_cache_pass): one cell per scheduled llama-benchy
    cell with context (at depth 0 there is none to cache) of a config in the pass. Its
    cells share the depth cells' context file; they run after all of a config's other cells."""

    name: ClassVar[str] = "benchy-cached"
    patterns: ClassVar[CellPatterns] = CellPatterns(
        raw="results/raw/{config}/depth_{depth}.pc.json",
        provenance="results/raw/{config}/depth_{depth}.pc.provenance.json",
        failure="results/failures/{config}/depth_{depth}.pc.json",
        log="logs/cells/{config}/depth_{depth}.pc.log",
        cell_id="depth_{depth}.pc",
    )

    def planned(self, grid: Grid, config: str, depth: int) -> CachedCellPlan:
        files = self.patterns.files(config=config, depth=depth)
        return CachedCellPlan(
            config=config, depth=depth, files=files, expected_requests=self.expected_requests(grid)
        )

    def plan(self, grid: Grid, configs: Sequence[ServingConfig]) -> KindPlan[DepthCellPlan]:
        passing = [c for c in configs if c.name in grid.prefix_cache_pass]
        cold = BENCHY.plan(grid, passing).cells
        return KindPlan(tuple(self.planned(grid, c.config, c.depth) for c in cold if c.depth > 0))

    def expected_requests(self, grid: Grid) -> int:
        return super().expected_requests(grid) * 2  # a context-load request before each measured one


BENCHY = BenchyKind()
CACHED = CachedKind()


def measure_benchy(spec: DepthCell, engine: EngineLease, scratch: Path) -> Measured:
    """llama-benchy at the cell's depth, bracketed by spec-decode counter snapshots."""
    cfg = spec.serving_config
    # a cold cell starts from an empty cache; a prefix-cache cell too, so that only its own
    # context loads are there to hit, not what earlier cells left
    cache_reset = engine_kind(cfg.engine.kind).reset_prefix_cache(engine.base_url, engine.headers)
    book_url = benchy.seed_corpus(Path(spec.benchy.corpus))
    snapshots = scratch / "metrics"
    post_run = (
        snapshot_command(engine.base_url, snapshots, cfg.engine.api_key_env)
        if cfg.speculation.enabled
        else None
    )
    passed, entry, discarded = _run_until_checks_pass(
        spec, engine, scratch, snapshots, book_url=book_url, post_run=post_run
    )
    spec_decode = None
    if post_run:
        spec_decode = _acceptance(
            snapshots, passed.metrics_before, passed.metrics_after, spec.benchy.warmup, spec.what
        )
    decode = entry.tg_throughput.mean
    log.info(
        f"{spec.what}: decode {'-' if decode is None else f'{decode:.2f}'} tok/s, "
        f"TTFT {entry.e2e_ttft.mean:.1f} ms"
    )
    return Measured(
        files={"raw": passed.raw},
        versions=provenance.versions("llama-benchy", passed.result.version),
        bench=BenchyInvocation(
            argv=passed.run.argv,
            started_at=passed.started_at,
            finished_at=now_iso(),
            wall_s=round(passed.wall_s, 3),
            discarded_attempts=discarded,
        ),
        prefix_cache_reset=cache_reset,
        spec_decode=spec_decode,
    )


@dataclass(frozen=True)
class _Attempt:
    """One llama-benchy invocation of a cell: its run, its result and, where the config
    speculates, the engine's /metrics before and after it."""

    run: benchy.BenchyRun
    raw: bytes
    result: benchy.BenchyResult
    started_at: str
    wall_s: float
    metrics_before: str | None
    metrics_after: str | None


def _run_until_checks_pass(
    spec: DepthCell,
    engine: EngineLease,
    scratch: Path,
    snapshots: Path,
    *,
    book_url: str,
    post_run: str | None,
) -> tuple[_Attempt, benchy.BenchyEntry, tuple[str, ...]]:
    """llama-benchy until its result passes the checks: the passing attempt, its measured entry
    and why each attempt before it was discarded (at most benchy.transport_retries of them)."""
    discarded: list[str] = []
    while True:
        attempt = _attempt(spec, engine, scratch, snapshots, book_url=book_url, post_run=post_run)
        try:
            entry = benchy.check_result(
                attempt.result,
                benchy.read_progress(attempt.run.progress_path),
                depth=spec.depth,
                settings=spec.benchy,
                what=spec.what,
                prefix_cache=spec.prefix_cache,
            )
            return attempt, entry, tuple(discarded)
        except benchy.RetryableError as err:
            discarded.append(err.message)
            if len(discarded) > spec.benchy.transport_retries:
                raise
            log.info(f"{err.message}; measuring the cell again (attempt {len(discarded) + 1})")


def _attempt(
    spec: DepthCell,
    engine: EngineLease,
    scratch: Path,
    snapshots: Path,
    *,
    book_url: str,
    post_run: str | None,
) -> _Attempt:
    """Run llama-benchy once, from empty snapshots, and read its result."""
    shutil.rmtree(snapshots, ignore_errors=True)
    if post_run:
        snapshots.mkdir()
    run = benchy.build_run(
        spec.serving_config,
        spec.depth,
        spec.benchy,
        base_url=engine.base_url,
        book_url=book_url,
        workdir=scratch,
        post_run_cmd=post_run,
        prefix_cache=spec.prefix_cache,
    )
    before_own = probe.fetch_metrics(engine.base_url, engine.headers) if post_run else None
    started_at = now_iso()
    wall_s = benchy.run(run, timeout_s=spec.benchy.timeout_s, what=spec.what)
    after = probe.fetch_metrics(engine.base_url, engine.headers) if post_run else None
    try:
        raw = run.result_path.read_bytes()
        result = benchy.BenchyResult.from_json(json.loads(raw))
    except (FileNotFoundError, json.JSONDecodeError, ResultFileError) as err:
        raise BenchmarkError(f"{spec.what}: llama-benchy wrote no readable result: {err}") from err
    return _Attempt(run, raw, result, started_at, wall_s, before_own, after)


def snapshot_command(base_url: str, out_dir: Path, key_variable: str | None) -> str:
    """Shell line for llama-benchy's --post-run-cmd: save /metrics after every run."""
    argv = [sys.executable, "-m", "gridbench.engines.snapshot", f"{base_url}/metrics", str(out_dir.resolve())]
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
