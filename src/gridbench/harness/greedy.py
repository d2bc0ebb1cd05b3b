"""Greedy requests for the quality cells: one non-streamed chat completion per prompt at
temperature 0, its output text and (where the engine names them) its generated token ids.

The standard library's HTTP client only: the plan imports the quality kind on every
Snakemake run, and one request at a time needs no event loop.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import cattrs

from gridbench.engines import probe
from gridbench.engines.kinds import engine_kind
from gridbench.errors import BenchmarkError
from gridbench.harness.teacher_forced import TeacherForced
from gridbench.util import codec
from gridbench.util.files import JsonObject

if TYPE_CHECKING:
    from gridbench.config.grid import ServingConfig

LOAD_GENERATOR = "gridbench-greedy"
# v2 adds the teacher-forced pass, v3 each token's margin over the runner-up; v1 (greedy
# outputs only) and v2 results are still read
SCHEMA = "gridbench.quality.v3"
SCHEMAS = ("gridbench.quality.v1", "gridbench.quality.v2", SCHEMA)
# one greedy answer of a few dozen tokens; a server still busy after this is broken
REQUEST_TIMEOUT_S = 600.0
# vLLM's logprobs name a token so when asked to (return_tokens_as_token_ids)
_TOKEN_ID_TEXT = re.compile(r"token_id:(\d+)")


@dataclass(frozen=True)
class GreedySettings:
    """What every request of a quality cell shares (the quality section less what only the
    dataset reads, so a changed reference re-measures nothing)."""

    max_tokens: int
    extra_body: JsonObject


@dataclass(frozen=True)
class TopLogprob:
    """One of the most likely tokens at a position, named as ``LogprobToken`` names it."""

    token: str
    logprob: float
    id: int | None = None

    @property
    def token_id(self) -> int | None:
        return _token_id(self.id, self.token)


@dataclass(frozen=True)
class LogprobToken:
    """One generated token of a response's logprobs: llama.cpp names its id, vLLM its
    "token_id:N" text when asked."""

    token: str
    id: int | None = None
    logprob: float | None = None
    top_logprobs: tuple[TopLogprob, ...] = ()

    @property
    def token_id(self) -> int | None:
        return _token_id(self.id, self.token)

    @property
    def runner_up_margin(self) -> float | None:
        """How far (nats) the generated token's log-probability stands above the best other
        token's: near 0, a greedy choice that numerics alone may flip. None where the
        response named fewer than two tokens."""
        others = [t.logprob for t in self.top_logprobs if not self._is(t)]
        if self.logprob is None or not others:
            return None
        return self.logprob - max(others)

    def _is(self, other: TopLogprob) -> bool:
        mine, theirs = self.token_id, other.token_id
        return mine == theirs if mine is not None and theirs is not None else self.token == other.token


def _token_id(given: int | None, token: str) -> int | None:
    if given is not None:
        return given
    named = _TOKEN_ID_TEXT.fullmatch(token)
    return int(named.group(1)) if named else None


@dataclass(frozen=True)
class ChoiceLogprobs:
    content: tuple[LogprobToken, ...] | None = None


@dataclass(frozen=True)
class ChatMessage:
    content: str | None = None


@dataclass(frozen=True)
class ChatChoice:
    message: ChatMessage
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None


@dataclass(frozen=True)
class ChatUsage:
    completion_tokens: int


@dataclass(frozen=True)
class ChatCompletion:
    """The parts of an OpenAI chat completion a greedy output needs."""

    choices: tuple[ChatChoice, ...]
    usage: ChatUsage | None = None


@dataclass(frozen=True)
class GreedyOutput:
    """One prompt's greedy answer, as a quality result lists it."""

    prompt_class: str
    prompt: str  # as sent: outputs are compared only between cells given the same prompt
    text: str
    token_ids: tuple[int, ...] | None  # None where the engine named no token ids
    finish_reason: str | None
    output_tokens: int | None  # the usage block's count, where the engine gave one
    # per token, its log-probability's margin over the runner-up's (LogprobToken's);
    # None where the engine named no runner-up for some token (or a v1/v2 result)
    runner_up_margins: tuple[float, ...] | None = None


@dataclass(frozen=True)
class QualityResult:
    """A quality cell's raw result: every prompt's greedy output, in the study's class order,
    and the teacher-forced pass over the held-out text (None: not asked for, or a v1 result)."""

    schema: str
    config: str
    max_tokens: int
    outputs: tuple[GreedyOutput, ...]
    teacher_forced: TeacherForced | None = None


class GreedyRequestError(BenchmarkError):
    """A request the engine did not answer with a chat completion (the quality cell names
    itself and what to do when it passes the error on)."""


def request_body(prompt: str, settings: GreedySettings, cfg: ServingConfig) -> bytes:
    """The request's JSON body: the quality section's and the config's extra fields, under
    the greedy cell's own (temperature 0, its max_tokens, two logprobs per token, no cached
    prompt of an earlier request: the answer is the same whatever the engine served before)."""
    kind = engine_kind(cfg.engine.kind)
    body = {
        **settings.extra_body,
        **cfg.bench_extra_body,
        "model": cfg.checkpoint.served_model_name,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": settings.max_tokens,
        "temperature": 0,
        # the runner-up tells a near-tie (which numerics may flip) from a confident token
        "logprobs": True,
        "top_logprobs": 2,
        **kind.token_id_fields,
        **kind.fresh_prompt_fields(f"gridbench-greedy-{uuid.uuid4().hex}"),
        "stream": False,
    }
    return json.dumps(body).encode()


def greedy_output(prompt_class: str, prompt: str, status: int, text: str) -> GreedyOutput:
    """The output an engine's answer holds; a GreedyRequestError says why it holds none."""
    if status != 200:
        raise GreedyRequestError(f"HTTP {status or 'no answer'}: {text[:300]}")
    try:
        completion = codec.from_json(ChatCompletion, json.loads(text))
    except (json.JSONDecodeError, cattrs.BaseValidationError, TypeError) as err:
        raise GreedyRequestError(f"not a chat completion ({err}): {text[:300]}") from err
    if not completion.choices:
        raise GreedyRequestError(f"a chat completion without choices: {text[:300]}")
    choice = completion.choices[0]
    tokens = choice.logprobs.content if choice.logprobs else None
    ids = [t.token_id for t in tokens] if tokens is not None else [None]
    margins = [t.runner_up_margin for t in tokens] if tokens is not None else [None]
    return GreedyOutput(
        prompt_class=prompt_class,
        prompt=prompt,
        text=choice.message.content or "",
        token_ids=None if None in ids else tuple(i for i in ids if i is not None),
        finish_reason=choice.finish_reason,
        output_tokens=completion.usage.completion_tokens if completion.usage else None,
        runner_up_margins=None if None in margins else tuple(m for m in margins if m is not None),
    )


def send(base_url: str, headers: Mapping[str, str], body: bytes) -> tuple[int, str]:
    """(status, body) of one chat completion request."""
    return probe.http_post(
        base_url + "/v1/chat/completions", timeout=REQUEST_TIMEOUT_S, headers=headers, body=body
    )
