"""Greedy quality (kind "quality"): one cell per config sends every prompt of the quality
section's classes once, at temperature 0, through the engine's own chat API, and keeps each
output's text and token ids. The quality dataset compares them between configs: with a
reference serving the same model at the highest precision, and a speculative config with
its baseline (greedy speculation must change nothing)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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
from gridbench.cells.records import CellCoordinates, Measured, QualityInvocation
from gridbench.config.grid import Grid, ServingConfig
from gridbench.engines.events import now_iso
from gridbench.engines.kinds import engine_kind
from gridbench.errors import BenchmarkError, ConfigError
from gridbench.harness import greedy, teacher_forced
from gridbench.harness.prompts import resolve_prompts
from gridbench.layout import CellFiles
from gridbench.util import codec

if TYPE_CHECKING:
    from gridbench.engines.manager import EngineLease

log = logging.getLogger(__name__)

# a line per answered prompt, in the cell's scratch folder, read live by `gridbench progress`
PROGRESS_FILE = "quality.progress.jsonl"


@dataclass(frozen=True, kw_only=True)
class QualityCellPlan(PlannedCell):
    """A config's quality cell of the plan: it has no coordinates of its own."""

    kind: ClassVar[str] = "quality"

    @property
    def key(self) -> tuple[str]:
        return (self.config,)

    @property
    def cell_id(self) -> str:
        return QUALITY.patterns.cell_id

    @property
    def label(self) -> str:
        return f"{self.config} quality"

    @property
    def timing_keys(self) -> tuple[tuple[str, ...], ...]:
        return ("quality", self.config), ("quality",)


@dataclass(frozen=True)
class QualityPrompts:
    """A quality context's section: the requests' settings and the prompt of each class, so
    an edited prompt file reruns the cells, and the teacher-forced pass's settings with its
    text (None: no such pass)."""

    settings: greedy.GreedySettings = field(metadata=codec.INLINE)
    prompts: dict[str, str]
    teacher_forced: teacher_forced.TeacherForcedSettings | None = None


@dataclass(frozen=True)
class QualityContext:
    """The context file of one config's quality cell."""

    config: ServingConfig
    slots: list[str]
    quality: QualityPrompts


@dataclass(frozen=True)
class QualityProgressLine:
    """One line of a quality cell's progress file: written when a prompt's answer came."""

    done: int
    total: int
    status: str  # "ok", or why the request failed
    output_tokens: int  # of the answers so far
    elapsed_s: float


@dataclass(frozen=True)
class QualityCell(Cell):
    """Every quality prompt of one config, one greedy request each."""

    quality: QualityPrompts

    kind: ClassVar[str] = "quality"

    @property
    def cell_id(self) -> str:
        return QUALITY.patterns.cell_id

    @property
    def what(self) -> str:
        return f"cell {self.name} quality"

    @property
    def needs_fresh_engine(self) -> bool:
        # its greedy answers are compared token by token: they must not depend on what the
        # engine served before
        return engine_kind(self.config.engine.kind).answers_depend_on_what_it_served

    def files(self) -> CellFiles:
        return QUALITY.patterns.files(config=self.name)

    def coordinates(self) -> CellCoordinates:
        return CellCoordinates(depth=None, prefix_cache=False, prompt_class=None, concurrency=None)

    def measure(self, engine: EngineLease, scratch: Path) -> Measured:
        return measure_quality(self, engine, scratch)


class QualityKind(CellKind[QualityCellPlan]):
    """One cell per config, when the grid has a quality section."""

    name: ClassVar[str] = "quality"
    context_name: ClassVar[str] = "quality"
    patterns: ClassVar[CellPatterns] = CellPatterns(
        raw="results/quality/{config}.json",
        provenance="results/quality/{config}.provenance.json",
        failure="results/failures/quality/{config}.json",
        log="logs/cells/{config}/quality.log",
        cell_id="quality",
    )
    wildcard_names: ClassVar[tuple[str, ...]] = ()
    progress_file: ClassVar[str] = PROGRESS_FILE
    dataset: ClassVar[str] = "quality"

    def plan(self, grid: Grid, configs: Sequence[ServingConfig]) -> KindPlan[QualityCellPlan]:
        quality = grid.quality
        if quality is None:
            return KindPlan(())
        resolve_prompts(quality)  # an unknown class stops the plan
        return KindPlan(
            tuple(
                QualityCellPlan(
                    config=config.name,
                    files=self.patterns.files(config=config.name),
                    expected_requests=len(quality.prompt_classes),
                )
                for config in configs
            )
        )

    def wildcard_patterns(self, grid: Grid) -> dict[str, str]:
        return {}

    def coordinate_ranks(self, grid: Grid) -> dict[tuple[str, ...], int]:
        return {(): 0} if grid.quality else {}

    def host_files(self, grid: Grid, config: str) -> list[str]:
        prompt_file = grid.quality.prompt_file if grid.quality else None
        return [*grid.configs[config].files, *([prompt_file] if prompt_file else [])]

    def context(self, grid: Grid, config: str, slots: list[str]) -> QualityContext:
        quality = grid.quality
        if quality is None:
            raise ConfigError(f"config {config}: the grid has no quality section, so no quality cells")
        settings = greedy.GreedySettings(max_tokens=quality.max_tokens, extra_body=quality.extra_body)
        forced = (
            teacher_forced.TeacherForcedSettings(
                quality.teacher_forced_tokens, quality.teacher_forced_top_k, teacher_forced.heldout_text()
            )
            if quality.teacher_forced_tokens > 0
            else None
        )
        prompts = QualityPrompts(settings=settings, prompts=resolve_prompts(quality), teacher_forced=forced)
        return QualityContext(config=grid.configs[config], slots=slots, quality=prompts)

    def load(self, context: Path, wildcards: Mapping[str, str]) -> QualityCell:
        shared = codec.from_json(QualityContext, json.loads(Path(context).read_text()))
        return QualityCell(config=shared.config, slots=shared.slots, quality=shared.quality)

    def requests(self, text: str, expected: int) -> RequestProgress:
        lines = json_lines(QualityProgressLine, text)
        last = lines[-1] if lines else None
        return RequestProgress(
            load_generator=greedy.LOAD_GENERATOR,
            phase="measured",
            requests_done=last.done if last else 0,
            requests_expected=expected,
            requests_failed=sum(1 for line in lines if line.status != "ok"),
            tok_s=last.output_tokens / last.elapsed_s if last and last.elapsed_s > 0 else None,
            tok_s_meaning="output, one request at a time",
        )


QUALITY = QualityKind()


def measure_quality(spec: QualityCell, engine: EngineLease, scratch: Path) -> Measured:
    """Each prompt once, one request at a time (a batch's neighbours must not change a greedy
    answer); the first request the engine does not answer fails the cell."""
    cfg = spec.serving_config
    cache_reset = engine_kind(cfg.engine.kind).reset_prefix_cache(engine.base_url, engine.headers)
    started_at = now_iso()
    started = time.monotonic()
    outputs: list[greedy.GreedyOutput] = []
    prompts = spec.quality.prompts
    with (scratch / PROGRESS_FILE).open("a") as progress:

        def record(status: str) -> None:
            line = _progress(outputs, len(prompts), status, started)
            progress.write(json.dumps(codec.to_json(line)) + "\n")
            progress.flush()

        for prompt_class, prompt in prompts.items():
            body = greedy.request_body(prompt, spec.quality.settings, cfg)
            status, text = greedy.send(engine.base_url, engine.headers, body)
            try:
                outputs.append(greedy.greedy_output(prompt_class, prompt, status, text))
            except greedy.GreedyRequestError as err:
                record(str(err))
                raise BenchmarkError(
                    f"{spec.what}: the {prompt_class} prompt's greedy request failed: {err}",
                    hint="read the engine log; run the same command again to measure the cell again",
                ) from err
            record("ok")
    forced = _teacher_forced(spec, engine)
    wall_s = time.monotonic() - started
    result = greedy.QualityResult(
        schema=greedy.SCHEMA,
        config=cfg.name,
        max_tokens=spec.quality.settings.max_tokens,
        outputs=tuple(outputs),
        teacher_forced=forced,
    )
    with_ids = sum(1 for o in outputs if o.token_ids is not None)
    scored = f", {len(forced.positions)} teacher-forced positions" if forced else ""
    log.info(f"{spec.what}: {len(outputs)} greedy outputs ({with_ids} with ids){scored}, {wall_s:.1f} s")
    return Measured(
        files={"raw": (json.dumps(codec.to_json(result), indent=1) + "\n").encode()},
        versions=provenance.versions(greedy.LOAD_GENERATOR, gridbench.__version__),
        bench=QualityInvocation(
            url=engine.base_url + "/v1/chat/completions",
            model=cfg.checkpoint.served_model_name,
            started_at=started_at,
            finished_at=now_iso(),
            wall_s=round(wall_s, 3),
            greedy_requests=len(outputs),
        ),
        prefix_cache_reset=cache_reset,
        spec_decode=None,  # a few greedy requests say nothing of acceptance: the other kinds measure it
    )


def _teacher_forced(spec: QualityCell, engine: EngineLease) -> teacher_forced.TeacherForced | None:
    """The held-out text's pass, where the context asks for one; its first failed request
    fails the cell."""
    settings = spec.quality.teacher_forced
    if settings is None:
        return None
    cfg = spec.serving_config
    started = time.monotonic()
    try:
        on = teacher_forced.Engine(engine.base_url, engine.headers)
        forced = teacher_forced.measure(on, cfg.engine.kind, cfg.checkpoint.served_model_name, settings)
    except teacher_forced.TeacherForcedError as err:
        raise BenchmarkError(
            f"{spec.what}: the teacher-forced pass over the held-out text failed: {err}",
            hint="read the engine log; set quality.teacher_forced_tokens: 0 to measure without the pass",
        ) from err
    took = time.monotonic() - started
    log.info(f"{spec.what}: teacher-forced pass, {len(forced.positions)} positions in {took:.1f} s")
    return forced


def _progress(
    outputs: Sequence[greedy.GreedyOutput], total: int, status: str, started: float
) -> QualityProgressLine:
    return QualityProgressLine(
        done=len(outputs) + (status != "ok"),
        total=total,
        status=status,
        output_tokens=sum(o.output_tokens or 0 for o in outputs),
        elapsed_s=round(time.monotonic() - started, 3),
    )
