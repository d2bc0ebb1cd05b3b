"""Multi-turn sessions (kind "session"): one prompt class opening ``sessions`` concurrent
conversations, each turn resending the growing history, on the config's engine with its prefix
cache on (the prefix-cache pass's, plus the flags its kind needs to count cached tokens). A
few one-turn warm-ups first; every turn's TTFT and the engine's count of cached prompt tokens
(harness/sessions.py)."""

from __future__ import annotations

import asyncio
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
)
from gridbench.cells.kinds.natural import NATURAL
from gridbench.cells.records import CellCoordinates, Measured, SessionInvocation
from gridbench.config.grid import Grid, ServingConfig
from gridbench.engines.events import now_iso
from gridbench.engines.kinds import engine_kind
from gridbench.errors import BenchmarkError, ConfigError
from gridbench.harness import stats
from gridbench.harness.prompts import Conversation, resolve_prompts
from gridbench.layout import CellFiles
from gridbench.util import codec

if TYPE_CHECKING:
    from gridbench.engines.manager import EngineLease
    from gridbench.harness.natural import Endpoint
    from gridbench.harness.sessions import SessionResult
    from gridbench.harness.stats import RequestTrace

log = logging.getLogger(__name__)

# the natural harness's progress lines, in the cell's scratch folder
PROGRESS_FILE = "sessions.progress.jsonl"


@dataclass(frozen=True, kw_only=True)
class SessionCellPlan(PlannedCell):
    """A session cell of the plan."""

    prompt_class: str
    sessions: int

    kind: ClassVar[str] = "session"

    @property
    def key(self) -> tuple[str, str, int]:
        return self.config, self.prompt_class, self.sessions

    @property
    def cell_id(self) -> str:
        return SESSION.patterns.cell_id.format(prompt_class=self.prompt_class, sessions=self.sessions)

    @property
    def label(self) -> str:
        return f"{self.config} {self.prompt_class} sessions={self.sessions}"

    @property
    def timing_keys(self) -> tuple[tuple[str | int, ...], ...]:
        return ("session", self.config, self.sessions), ("session", self.sessions), ("session",)


@dataclass(frozen=True)
class SessionContext:
    """A context file of one config's session cells: how they converse and every class's prompt."""

    config: ServingConfig
    slots: list[str]
    conversation: Conversation = field(metadata=codec.INLINE)
    prompts: dict[str, str]


@dataclass(frozen=True)
class SessionCell(Cell):
    """One prompt class opening ``sessions`` concurrent multi-turn conversations."""

    prompt_class: str
    sessions: int
    conversation: Conversation
    prompt: str

    kind: ClassVar[str] = "session"

    @property
    def serving_config(self) -> ServingConfig:
        """The config with its prefix cache on and its engine counting the cached tokens."""
        cfg = self.config.with_prefix_cache()
        flags = engine_kind(cfg.engine.kind).cached_prompt_tokens_flags
        missing = tuple(flag for flag in flags if flag not in cfg.serve_args)
        return replace(cfg, extra_args=cfg.extra_args + missing)

    @property
    def cell_id(self) -> str:
        return SESSION.patterns.cell_id.format(prompt_class=self.prompt_class, sessions=self.sessions)

    @property
    def what(self) -> str:
        return f"cell {self.name} {self.prompt_class} sessions={self.sessions}"

    def files(self) -> CellFiles:
        return SESSION.patterns.files(
            config=self.name, prompt_class=self.prompt_class, sessions=self.sessions
        )

    def coordinates(self) -> CellCoordinates:
        return CellCoordinates(
            depth=None,
            prefix_cache=True,
            prompt_class=self.prompt_class,
            concurrency=None,
            sessions=self.sessions,
        )

    def measure(self, engine: EngineLease, scratch: Path) -> Measured:
        return measure_sessions(self, engine, scratch)


class SessionKind(CellKind[SessionCellPlan]):
    """Config, then prompt class, then concurrent sessions ascending; an unknown prompt class
    stops the plan. Its cells run after the prefix-cache pass, on an engine with the cache on."""

    name: ClassVar[str] = "session"
    context_name: ClassVar[str] = "session"
    patterns: ClassVar[CellPatterns] = CellPatterns(
        raw="results/sessions/{config}/{prompt_class}_s{sessions}.json",
        provenance="results/sessions/{config}/{prompt_class}_s{sessions}.provenance.json",
        failure="results/failures/sessions/{config}/{prompt_class}_s{sessions}.json",
        log="logs/cells/{config}/sessions_{prompt_class}_s{sessions}.log",
        cell_id="sessions_{prompt_class}_s{sessions}",
    )
    wildcard_names: ClassVar[tuple[str, ...]] = ("prompt_class", "sessions")
    progress_file: ClassVar[str] = PROGRESS_FILE
    dataset: ClassVar[str] = "sessions"

    def plan(self, grid: Grid, configs: Sequence[ServingConfig]) -> KindPlan[SessionCellPlan]:
        settings = grid.sessions
        if settings is None:
            return KindPlan(())
        resolve_prompts(settings)
        return KindPlan(
            tuple(
                SessionCellPlan(
                    config=config.name,
                    prompt_class=prompt_class,
                    sessions=sessions,
                    files=self.patterns.files(
                        config=config.name, prompt_class=prompt_class, sessions=sessions
                    ),
                    expected_requests=sessions * settings.conversation.turns,
                )
                for config in configs
                for prompt_class, sessions in self._levels(grid)
            )
        )

    @staticmethod
    def _levels(grid: Grid) -> list[tuple[str, int]]:
        settings = grid.sessions
        if settings is None:
            return []
        return [(c, s) for c in settings.prompt_classes for s in sorted(settings.sessions)]

    def wildcard_patterns(self, grid: Grid) -> dict[str, str]:
        classes = grid.sessions.prompt_classes if grid.sessions else ()
        return {"prompt_class": "|".join(map(re.escape, classes)) or "NO_CLASS", "sessions": r"\d+"}

    def coordinate_ranks(self, grid: Grid) -> dict[tuple[str, ...], int]:
        levels = [(c, str(s)) for c, s in self._levels(grid)]
        return {level: rank for rank, level in enumerate(levels)}

    def host_files(self, grid: Grid, config: str) -> list[str]:
        prompt_file = grid.sessions.prompt_file if grid.sessions else None
        return [*grid.configs[config].files, *([prompt_file] if prompt_file else [])]

    def context(self, grid: Grid, config: str, slots: list[str]) -> SessionContext:
        if grid.sessions is None:
            raise ConfigError(f"config {config}: the grid has no sessions section, so no session cells")
        return SessionContext(
            config=grid.configs[config],
            slots=slots,
            conversation=grid.sessions.conversation,
            prompts=resolve_prompts(grid.sessions),
        )

    def load(self, context: Path, wildcards: Mapping[str, str]) -> SessionCell:
        shared = codec.from_json(SessionContext, json.loads(Path(context).read_text()))
        prompt_class = wildcards["prompt_class"]
        return SessionCell(
            config=shared.config,
            slots=shared.slots,
            prompt_class=prompt_class,
            sessions=int(wildcards["sessions"]),
            conversation=shared.conversation,
            prompt=shared.prompts[prompt_class],
        )

    def requests(self, text: str, expected: int) -> RequestProgress:
        """The natural harness's progress lines: warm-up, then the conversations' turns."""
        return replace(NATURAL.requests(text, expected), load_generator="sessions")


SESSION = SessionKind()


def measure_sessions(spec: SessionCell, engine: EngineLease, scratch: Path) -> Measured:
    """Warm up, then the conversations, every turn's trace kept."""
    from gridbench.harness import natural, sessions  # aiohttp: a quarter second the plan skips

    cfg = spec.serving_config
    kind = engine_kind(cfg.engine.kind)
    # the config's bench extra_body over the section's
    conversation = replace(
        spec.conversation, extra_body={**spec.conversation.extra_body, **cfg.bench_extra_body}
    )
    endpoint = natural.Endpoint(engine.base_url, cfg.checkpoint.served_model_name, engine.headers)
    cache_reset = kind.reset_prefix_cache(engine.base_url, engine.headers)
    started_at = now_iso()
    progress = scratch / PROGRESS_FILE
    warmups = _warm_up(endpoint, conversation, spec.prompt, progress)
    window_started = time.monotonic()
    with natural.progress_file(progress, "measured", spec.sessions * conversation.turns) as on_finished:
        sent = asyncio.run(sessions.converse(endpoint, conversation, spec.prompt, spec.sessions, on_finished))
    wall_s = time.monotonic() - window_started
    turns = sessions.turn_records(sent, conversation, kind.cached_prompt_tokens)
    result = sessions.SessionResult(
        config=cfg.name,
        prompt_class=spec.prompt_class,
        sessions=spec.sessions,
        settings=spec.conversation,
        prompt=spec.prompt,
        cached_prompt_tokens_key=kind.cached_prompt_tokens_key,
        cached_prompt_tokens_missing=sessions.missing_cached_counts(
            turns, kind.cached_prompt_tokens_key, kind.label
        ),
        turns=turns,
        summary=sessions.summarize_turns(turns, conversation.turns),
    )
    raw = (json.dumps(codec.to_json(result), indent=1, allow_nan=False) + "\n").encode()
    _check_any_ok(result, raw, scratch=scratch, what=spec.what)
    for turn in result.summary:
        log.info(
            f"{spec.what}: turn {turn.turn}: {turn.ok}/{spec.sessions} ok, TTFT p50 {turn.ttft_ms_p50} ms, "
            f"prompt {turn.prompt_tokens_mean} tokens, cached share {turn.cached_prompt_share}"
        )
    return Measured(
        files={"raw": raw},
        versions=provenance.versions(sessions.LOAD_GENERATOR, gridbench.__version__),
        bench=SessionInvocation(
            url=endpoint.url,
            model=endpoint.model,
            started_at=started_at,
            finished_at=now_iso(),
            wall_s=round(wall_s, 3),
            warmup=stats.warmup_outcomes(warmups),
            concurrent_sessions=spec.sessions,
        ),
        prefix_cache_reset=cache_reset,
        spec_decode=None,  # acceptance is the depth and natural cells' measure
    )


def _warm_up(
    endpoint: Endpoint, conversation: Conversation, prompt: str, progress: Path
) -> list[RequestTrace]:
    """Serial one-turn requests, each behind its own prefix (no session's), not counted."""
    from gridbench.harness import natural

    requests = [
        natural.ChatRequest(
            index=i,
            text=f"[warm-up-{i}] {prompt}",
            max_tokens=min(natural.WARMUP_MAX_TOKENS, conversation.max_tokens),
            temperature=conversation.temperature,
            extra_body=conversation.extra_body,
        )
        for i in range(conversation.warmup)
    ]
    if not requests:
        return []
    with natural.progress_file(progress, "warm-up", len(requests)) as on_finished:
        return asyncio.run(
            natural.run_requests(endpoint, requests, 1, conversation.request_timeout_s, on_finished)
        )


def _check_any_ok(result: SessionResult, raw: bytes, *, scratch: Path, what: str) -> None:
    """A failed turn is a measured result (its conversation ends there); a cell none of whose
    turns succeeded measured nothing, and fails with its raw result kept."""
    if any(turn.ok for turn in result.summary):
        return
    (scratch / "sessions.json").write_bytes(raw)
    first = next((t.request.error for t in result.turns), None)
    raise BenchmarkError(
        f"{what}: none of its {result.sessions} conversations had a turn answered; first: {first}",
        hint="read the engine log; every turn's outcome is in the kept sessions.json",
    )
