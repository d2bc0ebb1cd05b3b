"""Open-loop load (kind "load"): one prompt class at one arrival process and request rate.
A few serial warm-up requests, then the cell's seeded schedule (or its trace's, replayed at
the cell's rate with each request's lengths) sent open loop (each request at its time,
whatever the engine's pace), every request kept with its due time and lag. The SLO is not
the cell's: the load dataset judges the requests by the study's SLO as it stands."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import gridbench
from gridbench.assets.corpus import synthetic_book
from gridbench.cells import provenance
from gridbench.cells.kinds.base import (
    Cell,
    CellKind,
    CellPatterns,
    KindPlan,
    PlannedCell,
    RequestProgress,
)
from gridbench.cells.kinds.natural import NATURAL
from gridbench.cells.records import CellCoordinates, LoadInvocation, Measured
from gridbench.config.grid import Grid, ServingConfig
from gridbench.engines.events import now_iso
from gridbench.engines.kinds import engine_kind
from gridbench.errors import BenchmarkError, ConfigError
from gridbench.harness import arrivals, goodput, stats, trace
from gridbench.harness.arrivals import TRACE, Arrival, Schedule, Sending, rate_name
from gridbench.harness.prompts import resolve_prompts
from gridbench.harness.trace import LoadTrace, TraceEntry
from gridbench.layout import CellFiles
from gridbench.util import codec

if TYPE_CHECKING:
    from gridbench.engines.manager import EngineLease
    from gridbench.harness.load import LoadResult
    from gridbench.harness.natural import ChatRequest, LevelPlan

log = logging.getLogger(__name__)

# the natural harness's progress lines, in the cell's scratch folder
PROGRESS_FILE = "load.progress.jsonl"


def _searched_rates(raw_pattern: str, listed: Sequence[float]) -> list[float]:
    """The rates a search added: those of the raw files matching ``raw_pattern`` (the load
    kind's, every coordinate but the rate filled in) that the load section does not list."""
    prefix, suffix = raw_pattern.split("{rate}")
    found = []
    for raw in Path().glob(prefix + "*" + suffix):
        text = raw.as_posix()[len(prefix) : -len(suffix)]
        try:
            rate = float(text)
        except ValueError:  # another file in the folder (a provenance record)
            continue
        if rate not in listed:
            found.append(rate)
    return sorted(found)


@dataclass(frozen=True, kw_only=True)
class LoadCellPlan(PlannedCell):
    """A load cell of the plan."""

    prompt_class: str
    arrival: str  # Arrival.name
    rate_req_s: float

    kind: ClassVar[str] = "load"

    @property
    def key(self) -> tuple[str, str, str, float]:
        return self.config, self.prompt_class, self.arrival, self.rate_req_s

    @property
    def cell_id(self) -> str:
        return LOAD.patterns.cell_id.format(
            prompt_class=self.prompt_class, arrival=self.arrival, rate=rate_name(self.rate_req_s)
        )

    @property
    def label(self) -> str:
        return f"{self.config} {self.prompt_class} {self.arrival} {rate_name(self.rate_req_s)} req/s"

    @property
    def timing_keys(self) -> tuple[tuple[str | float, ...], ...]:
        return ("load", self.config, self.rate_req_s), ("load", self.rate_req_s), ("load",)


@dataclass(frozen=True)
class LoadContext:
    """A context file of one config's load cells: how they send, every class's prompt, and
    each trace arrival's requests by its name (left out without one: the contexts of studies
    without traces, and so their cells, stay as they were)."""

    config: ServingConfig
    slots: list[str]
    sending: Sending
    prompts: dict[str, str]
    traces: dict[str, LoadTrace] = field(default_factory=dict, metadata=codec.OMITTED_WHEN_DEFAULT)


@dataclass(frozen=True)
class LoadCell(Cell):
    """One prompt class at one arrival process and rate, sent open loop."""

    prompt_class: str
    arrival: Arrival
    rate_req_s: float
    sending: Sending
    prompt: str
    trace: tuple[TraceEntry, ...] = ()  # a trace arrival's requests, as its file holds them

    kind: ClassVar[str] = "load"

    @property
    def cell_id(self) -> str:
        return LOAD.patterns.cell_id.format(
            prompt_class=self.prompt_class, arrival=self.arrival.name, rate=rate_name(self.rate_req_s)
        )

    @property
    def what(self) -> str:
        return f"cell {self.name} {self.prompt_class} {self.arrival.name} {rate_name(self.rate_req_s)} req/s"

    def files(self) -> CellFiles:
        return LOAD.patterns.files(
            config=self.name,
            prompt_class=self.prompt_class,
            arrival=self.arrival.name,
            rate=rate_name(self.rate_req_s),
        )

    def coordinates(self) -> CellCoordinates:
        return CellCoordinates(
            depth=None,
            prefix_cache=False,
            prompt_class=self.prompt_class,
            concurrency=None,
            arrival=self.arrival.name,
            rate_req_s=self.rate_req_s,
        )

    def measure(self, engine: EngineLease, scratch: Path) -> Measured:
        return measure_load(self, engine, scratch)


def _alternatives(values: Sequence[str]) -> str:
    return "|".join(map(re.escape, values)) or "NO_VALUE"


class LoadKind(CellKind[LoadCellPlan]):
    """Config, then prompt class, then arrival process, then rate ascending; an unknown prompt
    class stops the plan."""

    name: ClassVar[str] = "load"
    context_name: ClassVar[str] = "load"
    patterns: ClassVar[CellPatterns] = CellPatterns(
        raw="results/load/{config}/{prompt_class}_{arrival}_r{rate}.json",
        provenance="results/load/{config}/{prompt_class}_{arrival}_r{rate}.provenance.json",
        failure="results/failures/load/{config}/{prompt_class}_{arrival}_r{rate}.json",
        log="logs/cells/{config}/load_{prompt_class}_{arrival}_r{rate}.log",
        cell_id="{prompt_class}_{arrival}_r{rate}",
    )
    wildcard_names: ClassVar[tuple[str, ...]] = ("prompt_class", "arrival", "rate")
    progress_file: ClassVar[str] = PROGRESS_FILE
    dataset: ClassVar[str] = "load"

    def plan(self, grid: Grid, configs: Sequence[ServingConfig]) -> KindPlan[LoadCellPlan]:
        load = grid.load
        if load is None:
            return KindPlan(())
        resolve_prompts(load)
        return KindPlan(
            tuple(
                LoadCellPlan(
                    config=config.name,
                    prompt_class=prompt_class,
                    arrival=arrival.name,
                    rate_req_s=rate,
                    files=self.patterns.files(
                        config=config.name,
                        prompt_class=prompt_class,
                        arrival=arrival.name,
                        rate=rate_name(rate),
                    ),
                    expected_requests=load.sending.requests_at(rate),
                )
                for config in configs
                for prompt_class, arrival, rate in self._levels(grid)
            )
        )

    def searched(self, grid: Grid, configs: Sequence[ServingConfig]) -> tuple[LoadCellPlan, ...]:
        """The cells a capacity search added (gridbench load-search) whose raw files exist,
        after the listed ones."""
        load = grid.load
        if load is None:
            return ()
        cells = []
        for config in configs:
            for prompt_class in load.prompt_classes:
                for arrival in load.arrivals:
                    at = {"config": config.name, "prompt_class": prompt_class, "arrival": arrival.name}
                    pattern = self.patterns.raw.format(**at, rate="{rate}")
                    for rate in _searched_rates(pattern, load.rates):
                        files = self.patterns.files(**at, rate=rate_name(rate))
                        expected = load.sending.requests_at(rate)
                        plan = LoadCellPlan(**at, rate_req_s=rate, files=files, expected_requests=expected)
                        cells.append(plan)
        return tuple(cells)

    @staticmethod
    def _levels(grid: Grid) -> list[tuple[str, Arrival, float]]:
        load = grid.load
        if load is None:
            return []
        rates = sorted(load.rates)
        return [(c, a, r) for c in load.prompt_classes for a in load.arrivals for r in rates]

    def wildcard_patterns(self, grid: Grid) -> dict[str, str]:
        load = grid.load
        return {
            "prompt_class": _alternatives(load.prompt_classes if load else ()),
            "arrival": _alternatives([a.name for a in load.arrivals] if load else ()),
            "rate": _alternatives([rate_name(r) for r in load.rates] if load else ()),
        }

    def coordinate_ranks(self, grid: Grid) -> dict[tuple[str, ...], int]:
        levels = [(c, a.name, rate_name(r)) for c, a, r in self._levels(grid)]
        return {level: rank for rank, level in enumerate(levels)}

    def host_files(self, grid: Grid, config: str) -> list[str]:
        prompt_file = grid.load.prompt_file if grid.load else None
        traces = [a.trace for a in grid.load.arrivals if a.trace] if grid.load else []
        return [*grid.configs[config].files, *([prompt_file] if prompt_file else []), *traces]

    def context(self, grid: Grid, config: str, slots: list[str]) -> LoadContext:
        if grid.load is None:
            raise ConfigError(f"config {config}: the grid has no load section, so no load cells")
        return LoadContext(
            config=grid.configs[config],
            slots=slots,
            sending=grid.load.sending,
            prompts=resolve_prompts(grid.load),
            traces={a.name: trace.read_trace(a.trace) for a in grid.load.arrivals if a.trace},
        )

    def load(self, context: Path, wildcards: Mapping[str, str]) -> LoadCell:
        shared = codec.from_json(LoadContext, json.loads(Path(context).read_text()))
        prompt_class, arrival = wildcards["prompt_class"], wildcards["arrival"]
        replay = shared.traces.get(arrival)
        return LoadCell(
            config=shared.config,
            slots=shared.slots,
            prompt_class=prompt_class,
            arrival=Arrival(TRACE, trace=replay.path) if replay else Arrival.from_name(arrival),
            rate_req_s=float(wildcards["rate"]),
            sending=shared.sending,
            prompt=shared.prompts[prompt_class],
            trace=replay.entries if replay else (),
        )

    def requests(self, text: str, expected: int) -> RequestProgress:
        """The natural harness's progress lines: warm-up, then the scheduled requests."""
        return replace(NATURAL.requests(text, expected), load_generator="load")


LOAD = LoadKind()


def measure_load(spec: LoadCell, engine: EngineLease, scratch: Path) -> Measured:
    """Warm up, then the cell's schedule, open loop."""
    from gridbench.harness import load, natural  # aiohttp: a quarter second the plan skips

    cfg, sending = spec.serving_config, spec.sending
    plan = _level_plan(spec)
    endpoint = natural.Endpoint(engine.base_url, cfg.checkpoint.served_model_name, engine.headers)
    cache_reset = engine_kind(cfg.engine.kind).reset_prefix_cache(engine.base_url, engine.headers)
    started_at = now_iso()
    progress = scratch / PROGRESS_FILE
    warmups = natural.warm_up(endpoint, plan, progress)
    schedule, requests = _scheduled_requests(spec, plan)
    window_started = time.monotonic()
    processes = load.load_processes(sending.processes, spec.rate_req_s, plan.requests, os.cpu_count())
    with natural.progress_file(progress, "measured", plan.requests) as on_finished:
        run = load.run_open_loop(
            endpoint,
            requests,
            schedule.offsets_s,
            plan.request_timeout_s,
            on_finished,
            processes,
            sending.saturation_wait_s,
        )
    wall_s = time.monotonic() - window_started
    result = load.level_result(
        config=cfg.name,
        prompt_class=spec.prompt_class,
        schedule=schedule,
        settings=load.LoadLevelSettings.of(plan, spec.arrival, sending.seed),
        run=run,
    )
    raw = (json.dumps(codec.to_json(result), indent=1, allow_nan=False) + "\n").encode()
    _check_any_ok(result, raw, scratch=scratch, what=spec.what)
    summary, lag = result.summary, goodput.lag_split(result.requests)
    log.info(
        f"{spec.what}: {summary.ok}/{summary.requests} ok, achieved {summary.achieved_req_s} req/s of "
        f"{summary.offered_req_s} offered, schedule lag p99 {summary.schedule_lag_ms_p99} ms (the "
        f"client's {lag.client_lag_ms_p99} ms, waiting for the server to accept {lag.accept_wait_ms_p99} "
        f"ms) from {processes} harness process(es), TTFT p50 {summary.ttft_ms_p50} ms, "
        f"saturated: {summary.saturated}"
        + (f", ended early at {summary.ended_early_s} s" if summary.ended_early_s is not None else "")
    )
    return Measured(
        files={"raw": raw},
        versions=provenance.versions(load.LOAD_GENERATOR, gridbench.__version__),
        bench=LoadInvocation(
            url=endpoint.url,
            model=endpoint.model,
            started_at=started_at,
            finished_at=now_iso(),
            wall_s=round(wall_s, 3),
            warmup=stats.warmup_outcomes(warmups),
            schedule_seed=sending.seed,
            harness_processes=processes,
        ),
        prefix_cache_reset=cache_reset,
        spec_decode=None,  # acceptance is the depth and natural cells' measure
    )


def _level_plan(spec: LoadCell) -> LevelPlan:
    """The natural harness's plan of the cell's requests: their bodies, and its warm-ups."""
    from gridbench.harness.natural import LevelPlan

    sending = spec.sending
    return LevelPlan(
        prompt=spec.prompt,
        concurrency=1,  # the warm-ups' (the schedule, not a limit, paces the measured ones)
        requests=sending.requests_at(spec.rate_req_s),
        warmup=sending.warmup,
        max_tokens=sending.max_tokens,
        temperature=sending.temperature,
        cache_bust=sending.cache_bust,
        # the config's over the section's
        extra_body={**sending.extra_body, **spec.serving_config.bench_extra_body},
        request_timeout_s=sending.request_timeout_s,
    )


def _scheduled_requests(spec: LoadCell, plan: LevelPlan) -> tuple[Schedule, list[ChatRequest]]:
    """The cell's schedule and its measured requests: the seeded draw's, all alike, or its
    trace's, each prompt cut or padded to its input length and asking for its output length."""
    sending = spec.sending
    if not spec.trace:
        schedule = arrivals.schedule(spec.arrival, spec.rate_req_s, plan.requests, sending.seed)
        return schedule, [plan.request(plan.warmup + i) for i in range(plan.requests)]
    replayed = trace.replayed(spec.trace, spec.rate_req_s, plan.requests)
    schedule = Schedule(spec.arrival, spec.rate_req_s, sending.seed, tuple(e.offset_s for e in replayed))
    return schedule, trace_requests(plan, replayed, synthetic_book().split())


def trace_requests(
    plan: LevelPlan, replayed: Sequence[TraceEntry], corpus: Sequence[str]
) -> list[ChatRequest]:
    """A replayed trace's requests, after the plan's warm-ups: the plan's prompt (with its
    cache-busting prefix) cut or padded to each input length, each its own output length."""
    requests = []
    for position, entry in enumerate(replayed):
        base = plan.request(plan.warmup + position, max_tokens=entry.output_tokens)
        text = trace.fit_prompt(base.text, corpus, entry.input_tokens, start=997 * position)
        requests.append(replace(base, text=text))
    return requests


def _check_any_ok(result: LoadResult, raw: bytes, *, scratch: Path, what: str) -> None:
    """Failed requests under load are a measured result (they miss the SLO); a cell none of
    whose requests succeeded measured nothing, and fails with its raw result kept."""
    if result.summary.ok:
        return
    (scratch / "load.json").write_bytes(raw)
    first = next((r.record.error for r in result.requests), None)
    raise BenchmarkError(
        f"{what}: none of its {result.summary.requests} requests succeeded; first: {first}",
        hint="read the engine log; every request's outcome is in the kept load.json",
    )
