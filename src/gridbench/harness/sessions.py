"""The session harness: multi-turn conversations through the natural harness's streaming client.

A cell runs ``sessions`` conversations at once. Each sends its turns in order, each turn once
the previous one has been answered: turn 1 is the class's prompt behind a prefix of its own
("[session-K] ", so no two conversations share a prompt past the chat template's start),
and turn k resends the whole history (every earlier user message and the model's actual
answer to it) with the k-th user message, a follow-up. Its later turns' prompts therefore
begin with what the engine has just processed for that conversation, so the prefix cache
decides their TTFT. A turn that fails ends its conversation: without its answer there is no
history to resend.

Each turn's record keeps the prompt tokens the engine counted and those it says it took from
its cache (the engine kind names the usage chunk's counter: EngineKind.cached_prompt_tokens);
``summarize_turns`` and everything below it are pure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import fmean, median

from gridbench.harness import natural, stats
from gridbench.harness.natural import ChatMessage, ChatRequest, Endpoint
from gridbench.harness.prompts import Conversation
from gridbench.harness.stats import OK, RequestRecord, RequestTrace

SCHEMA = "gridbench.sessions.v1"
LOAD_GENERATOR = "gridbench-sessions"
PROMPT_TOKENS = "usage.prompt_tokens"  # the OpenAI usage block's, which every engine kind sends
_DIGITS = 4

CachedCount = Callable[[Mapping[str, int]], int | None]


def opening(prompt: str, session: int) -> str:
    """Turn 1's user message of conversation ``session``: its own prefix, then the prompt."""
    return f"[session-{session}] {prompt}"


def turn_request(
    conversation: Conversation, prompt: str, session: int, turn: int, history: Sequence[ChatMessage]
) -> ChatRequest:
    """Turn ``turn`` (from 1) of conversation ``session``: its user message after ``history``,
    the earlier turns' messages and answers. Numbered session by session, turn by turn."""
    text = opening(prompt, session) if turn == 1 else conversation.follow_up(turn)
    return ChatRequest(
        index=session * conversation.turns + turn - 1,
        text=text,
        max_tokens=conversation.max_tokens,
        temperature=conversation.temperature,
        extra_body=conversation.extra_body,
        history=tuple(history),
        keep_answer=True,
    )


def answered(request: ChatRequest, trace: RequestTrace) -> tuple[ChatMessage, ...]:
    """The history the next turn resends: this turn's, its user message and its answer."""
    return (*request.history, ChatMessage("user", request.text), ChatMessage("assistant", trace.answer or ""))


async def converse(
    endpoint: Endpoint,
    conversation: Conversation,
    prompt: str,
    sessions: int,
    on_finished: Callable[[RequestTrace], None] = lambda _trace: None,
) -> list[tuple[ChatRequest, RequestTrace]]:
    """``sessions`` conversations at once; every sent turn's request and trace, session by session."""

    async def one(session: int) -> list[tuple[ChatRequest, RequestTrace]]:
        sent: list[tuple[ChatRequest, RequestTrace]] = []
        history: tuple[ChatMessage, ...] = ()
        for turn in range(1, conversation.turns + 1):
            request = turn_request(conversation, prompt, session, turn, history)
            trace = await natural.stream_request(http, endpoint, request, conversation.request_timeout_s)
            on_finished(trace)
            sent.append((request, trace))
            if trace.status != OK:
                break  # no answer, no history to resend
            history = answered(request, trace)
        return sent

    async with natural.client_session() as http:
        by_session = await asyncio.gather(*(one(session) for session in range(sessions)))
    return [pair for pairs in by_session for pair in pairs]


@dataclass(frozen=True)
class TurnRecord:
    """One sent turn: where it sits, the engine's prompt counts, what the client saw, the answer."""

    session: int  # from 0
    turn: int  # from 1
    prompt_tokens: int | None  # the whole history's, as the engine counted it
    cached_prompt_tokens: int | None  # of those, taken from its prefix cache; None: it did not say
    request: RequestRecord  # its clock from the cell's first request out
    answer: str | None  # resent by the next turn


@dataclass(frozen=True)
class TurnSummary:
    """Turn ``turn`` over the cell's conversations (its ok turns); None without samples."""

    turn: int
    ok: int  # of the cell's conversations: a turn not ok failed or was never sent
    ttft_ms_p50: float | None
    ttft_ms_mean: float | None
    ttft_ms_max: float | None
    decode_tok_s_p50: float | None  # 1000 / TPOT, per turn
    prompt_tokens_mean: float | None
    cached_prompt_tokens_mean: float | None  # None where any ok turn's count is missing
    cached_prompt_share: float | None  # cached over prompt tokens, summed over the ok turns
    output_tokens_mean: float | None


@dataclass(frozen=True, kw_only=True)
class SessionResult:
    """One session cell's raw result file (schema gridbench.sessions.v1): how it conversed,
    which engine counter gave the cached tokens (or why none did), every sent turn, and the
    turns' summaries."""

    schema: str = SCHEMA
    config: str
    prompt_class: str
    sessions: int
    settings: Conversation
    prompt: str
    cached_prompt_tokens_key: str | None  # the usage chunk's counter the engine kind reads
    cached_prompt_tokens_missing: str | None  # why a turn has no cached count; None: all have
    turns: tuple[TurnRecord, ...]  # session by session, turn by turn
    summary: tuple[TurnSummary, ...]  # by turn, from 1


def turn_records(
    sent: Sequence[tuple[ChatRequest, RequestTrace]], conversation: Conversation, cached: CachedCount
) -> tuple[TurnRecord, ...]:
    """Each sent turn's record, timed from the first request out."""
    origin = min(trace.start_ns for _, trace in sent)
    records = []
    for request, trace in sent:
        counts = dict(trace.counts)
        session, turn_index = divmod(request.index, conversation.turns)
        records.append(
            TurnRecord(
                session=session,
                turn=turn_index + 1,
                prompt_tokens=counts.get(PROMPT_TOKENS),
                cached_prompt_tokens=cached(counts) if trace.status == OK else None,
                request=replace(
                    stats.request_record(trace, origin), itl_ms=()
                ),  # the summary's TPOT suffices
                answer=trace.answer,
            )
        )
    return tuple(records)


def _mean(values: Sequence[float]) -> float | None:
    return round(fmean(values), _DIGITS) if values else None


def summarize_turn(turn: int, records: Sequence[TurnRecord]) -> TurnSummary:
    """Turn ``turn``'s summary from the records of that turn."""
    ok = [r for r in records if r.request.status == OK]
    ttfts = [r.request.ttft_ms for r in ok if r.request.ttft_ms is not None]
    decode = [1000 / r.request.tpot_ms for r in ok if r.request.tpot_ms]
    prompts = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    cached = [r.cached_prompt_tokens for r in ok if r.cached_prompt_tokens is not None]
    outputs = [r.request.output_tokens for r in ok if r.request.output_tokens is not None]
    every_count = bool(ok) and len(cached) == len(prompts) == len(ok)
    share = round(sum(cached) / total, _DIGITS) if every_count and (total := sum(prompts)) else None
    return TurnSummary(
        turn=turn,
        ok=len(ok),
        ttft_ms_p50=stats.nearest_rank(sorted(ttfts), 50),
        ttft_ms_mean=_mean(ttfts),
        ttft_ms_max=max(ttfts, default=None),
        decode_tok_s_p50=round(median(decode), _DIGITS) if decode else None,
        prompt_tokens_mean=_mean(prompts),
        cached_prompt_tokens_mean=_mean(cached) if every_count else None,
        cached_prompt_share=share,
        output_tokens_mean=_mean(outputs),
    )


def summarize_turns(records: Sequence[TurnRecord], turns: int) -> tuple[TurnSummary, ...]:
    """Turn by turn, from 1 to ``turns`` (a turn no conversation reached has no samples)."""
    return tuple(summarize_turn(turn, [r for r in records if r.turn == turn]) for turn in range(1, turns + 1))


def missing_cached_counts(records: Sequence[TurnRecord], key: str | None, engine: str) -> str | None:
    """Why some ok turn has no cached count, or None when every one has it."""
    if key is None:
        return f"{engine} reports no prompt tokens taken from its prefix cache"
    lacking = [r for r in records if r.request.status == OK and r.cached_prompt_tokens is None]
    if not lacking:
        return None
    return f"{len(lacking)} ok turns' usage chunks had no {key} (is the engine served with its flag for it?)"
