"""Natural prompts (kind "natural"): one prompt class at one concurrency through gridbench's
own streaming harness, warm-up requests first, the measured ones bracketed by the engine's
spec-decode counters when the config speculates."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import gridbench
from gridbench.cells import provenance
from gridbench.cells.kinds.base import (
    Cell,
    CellKind,
    CellPatterns,
    KindPlan,
    PlannedCell,
    RequestProgress,
    json_lines,
)
from gridbench.cells.records import CellCoordinates, Measured, NaturalInvocation
from gridbench.config.grid import Grid, ServingConfig
from gridbench.engines import probe
from gridbench.engines.events import now_iso
from gridbench.engines.kinds import engine_kind
from gridbench.engines.spec_metrics import Acceptance, acceptance, parse_spec_counters
from gridbench.errors import BenchmarkError, ConfigError
from gridbench.harness import stats
from gridbench.harness.prompts import NaturalSettings, resolve_prompts
from gridbench.layout import CellFiles
from gridbench.util import codec

if TYPE_CHECKING:
    from gridbench.engines.manager import EngineLease
    from gridbench.harness.natural import LevelResult

log = logging.getLogger(__name__)

# the harness's progress file in the cell's scratch folder, read live by `gridbench progress`
PROGRESS_FILE = "natural.progress.jsonl"


@dataclass(frozen=True, kw_only=True)
class NaturalCellPlan(PlannedCell):
    """A natural-prompt cell of the plan."""

    prompt_class: str
    concurrency: int

    kind: ClassVar[str] = "natural"

    @property
    def key(self) -> tuple[str, str, int]:
        return self.config, self.prompt_class, self.concurrency

    @property
    def cell_id(self) -> str:
        return NATURAL.patterns.cell_id.format(prompt_class=self.prompt_class, concurrency=self.concurrency)

    @property
    def label(self) -> str:
        return f"{self.config} {self.prompt_class} c={self.concurrency}"

    @property
    def timing_keys(self) -> tuple[tuple[str | int, ...], ...]:
        return ("natural", self.config, self.concurrency), ("natural", self.concurrency), ("natural",)


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
        return NATURAL.patterns.cell_id.format(prompt_class=self.prompt_class, concurrency=self.concurrency)

    @property
    def what(self) -> str:
        return f"cell {self.name} {self.prompt_class} c={self.concurrency}"

    def files(self) -> CellFiles:
        return NATURAL.patterns.files(
            config=self.name, prompt_class=self.prompt_class, concurrency=self.concurrency
        )

    def coordinates(self) -> CellCoordinates:
        return CellCoordinates(
            depth=None, prefix_cache=False, prompt_class=self.prompt_class, concurrency=self.concurrency
        )

    def measure(self, engine: EngineLease, scratch: Path) -> Measured:
        return measure_natural(self, engine, scratch)


@dataclass(frozen=True)
class NaturalPrompts:
    """A natural context's section: the study's settings and the prompt of each class, so
    an edited prompt file reruns its cells."""

    settings: NaturalSettings = field(metadata=codec.INLINE)
    prompts: dict[str, str]


@dataclass(frozen=True)
class NaturalContext:
    """A context file of one config's natural cells: what they share."""

    config: ServingConfig
    slots: list[str]
    natural: NaturalPrompts


class NaturalKind(CellKind[NaturalCellPlan]):
    """The natural-prompt matrix: config, then prompt class, then concurrency; an unknown
    prompt class stops the plan."""

    name: ClassVar[str] = "natural"
    context_name: ClassVar[str] = "natural"
    patterns: ClassVar[CellPatterns] = CellPatterns(
        raw="results/natural/{config}/{prompt_class}_c{concurrency}.json",
        provenance="results/natural/{config}/{prompt_class}_c{concurrency}.provenance.json",
        failure="results/failures/natural/{config}/{prompt_class}_c{concurrency}.json",
        log="logs/cells/{config}/natural_{prompt_class}_c{concurrency}.log",
        cell_id="{prompt_class}_c{concurrency}",
    )
    wildcard_names: ClassVar[tuple[str, ...]] = ("prompt_class", "concurrency")
    progress_file: ClassVar[str] = PROGRESS_FILE
    dataset: ClassVar[str] = "natural"

    def plan(self, grid: Grid, configs: Sequence[ServingConfig]) -> KindPlan[NaturalCellPlan]:
        natural = grid.natural
        if natural is None:
            return KindPlan(())
        resolve_prompts(natural)
        return KindPlan(
            tuple(
                NaturalCellPlan(
                    config=config.name,
                    prompt_class=prompt_class,
                    concurrency=concurrency,
                    files=self.patterns.files(
                        config=config.name, prompt_class=prompt_class, concurrency=concurrency
                    ),
                    expected_requests=natural.requests,
                )
                for config in configs
                for prompt_class in natural.prompt_classes
                for concurrency in natural.concurrency
            )
        )

    def wildcard_patterns(self, grid: Grid) -> dict[str, str]:
        classes = grid.natural.prompt_classes if grid.natural else ()
        return {"prompt_class": "|".join(map(re.escape, classes)) or "NO_CLASS", "concurrency": r"\d+"}

    def coordinate_ranks(self, grid: Grid) -> dict[tuple[str, ...], int]:
        if grid.natural is None:
            return {}
        levels = [(cls, str(c)) for cls in grid.natural.prompt_classes for c in grid.natural.concurrency]
        return {level: rank for rank, level in enumerate(levels)}

    def host_files(self, grid: Grid, config: str) -> list[str]:
        prompt_file = grid.natural.prompt_file if grid.natural else None
        return [*grid.configs[config].files, *([prompt_file] if prompt_file else [])]

    def context(self, grid: Grid, config: str, slots: list[str]) -> NaturalContext:
        if grid.natural is None:
            raise ConfigError(f"config {config}: the grid has no natural section, so no natural cells")
        prompts = NaturalPrompts(settings=grid.natural, prompts=resolve_prompts(grid.natural))
        return NaturalContext(config=grid.configs[config], slots=slots, natural=prompts)

    def load(self, context: Path, wildcards: Mapping[str, str]) -> NaturalCell:
        """The context holds every class's prompt."""
        shared = codec.from_json(NaturalContext, json.loads(Path(context).read_text()))
        prompt_class = wildcards["prompt_class"]
        return NaturalCell(
            config=shared.config,
            slots=shared.slots,
            prompt_class=prompt_class,
            concurrency=int(wildcards["concurrency"]),
            natural=shared.natural.settings,
            prompt=shared.natural.prompts[prompt_class],
        )

    def requests(self, text: str, expected: int) -> RequestProgress:
        """The latest phase's lines (warm-up, then measured)."""
        from gridbench.harness.natural import ProgressLine  # the harness's aiohttp only when read

        lines = json_lines(ProgressLine, text)
        if not lines:
            return RequestProgress("natural", "measured", 0, expected, 0, None, "output, all requests")
        last = lines[-1]
        of_phase = [line for line in lines if line.phase == last.phase]
        return RequestProgress(
            load_generator="natural",
            phase=last.phase,
            requests_done=last.done,
            requests_expected=last.total,
            requests_failed=sum(1 for line in of_phase if line.status != "ok"),
            tok_s=last.output_tokens / last.elapsed_s if last.elapsed_s > 0 else None,
            tok_s_meaning="output, all requests",
        )


NATURAL = NaturalKind()


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
    progress = scratch / PROGRESS_FILE
    warmups = natural.warm_up(endpoint, plan, progress)
    for trace in warmups:
        if trace.status != "ok":
            log.info(f"{spec.what}: warm-up request {trace.index} {trace.status}: {trace.error}")
    before = _settled_metrics(engine) if cfg.speculation.enabled else None
    window_started = time.monotonic()
    traces = natural.measure_level(endpoint, plan, progress)
    wall_s = time.monotonic() - window_started
    after = _settled_metrics(engine) if cfg.speculation.enabled else None
    spec_decode = _measured_acceptance(before, after, spec.what) if cfg.speculation.enabled else None
    result = natural.level_result(
        config=cfg.name, prompt_class=spec.prompt_class, plan=plan, traces=traces, spec_decode=spec_decode
    )
    raw = (json.dumps(codec.to_json(result), indent=1, allow_nan=False) + "\n").encode()
    _check_error_rate(result, raw, settings.max_error_rate, scratch=scratch, what=spec.what)
    summary = result.summary
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


def _measured_acceptance(before: str | None, after: str | None, what: str) -> Acceptance:
    """The draft acceptance over the measured requests, from /metrics read around them."""
    if before is None or after is None:
        raise BenchmarkError(f"{what}: could not read the engine's /metrics around the measured window")
    return acceptance(
        parse_spec_counters(before),
        parse_spec_counters(after),
        "the measured requests (after the warm-up requests)",
    )


def _check_error_rate(
    result: LevelResult, raw: bytes, max_error_rate: float, *, scratch: Path, what: str
) -> None:
    """A level whose requests failed too often fails, its raw result kept beside the failure record."""
    summary = result.summary
    error_rate = summary.error_rate or 0.0  # None only for a level of no requests
    if error_rate > max_error_rate:
        (scratch / "natural.json").write_bytes(raw)
        first = next(r.error for r in result.requests if r.status != "ok")
        raise BenchmarkError(
            f"{what}: {summary.errored} errored and {summary.incomplete} incomplete of "
            f"{summary.requests} requests (error rate {error_rate:.2f} > "
            f"natural.max_error_rate {max_error_rate:g}); first: {first}",
            hint="read the engine log; every request's outcome is in the kept natural.json",
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
