"""Teacher-forced log-probabilities for the quality cells: a fixed held-out text, tokenized
by the engine itself, and at each position the engine's log-probability of the text's next
token with its top-K, the same token sequence for every config.

The held-out text is packaged (``gridbench/data/heldout.txt``: the Gettysburg Address, Bliss
copy, public domain), so it is fixed and versioned with gridbench; nothing is downloaded.

How each engine gives the numbers (its kind's ``teacher_forcing``):

- ``forced-steps`` (llama.cpp's server, which returns no prompt log-probabilities): one
  ``/completion`` per position with the text's ids so far as the prompt, one token to
  predict, ``n_probs`` K, ``post_sampling_probs`` false and a ``logit_bias`` forcing the
  text's next token. The bias only steers the sampler: the probabilities llama.cpp returns
  are the raw logits' softmax, so the forced token's log-probability and the top-K are the
  unforced ones (tests/test_quality.py checks it on the server). With the prompt cache on,
  each request evaluates about one new token.
- ``prompt-logprobs`` (vLLM): one ``/v1/completions`` of the ids with ``prompt_logprobs`` K.

The standard library's HTTP client only, as ``greedy.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TypeVar

import cattrs

from gridbench.engines import probe
from gridbench.engines.kinds import engine_kind
from gridbench.errors import BenchmarkError
from gridbench.util import codec

FORCED_STEPS = "forced-steps"
PROMPT_LOGPROBS = "prompt-logprobs"
# a logit bias that makes the sampler pick the token whatever the logits say
FORCING_BIAS = 1e9
REQUEST_TIMEOUT_S = 600.0


def heldout_text() -> str:
    return resources.files("gridbench").joinpath("data/heldout.txt").read_text()


@dataclass(frozen=True)
class TeacherForcedSettings:
    """What a cell's teacher-forced pass scores: ``tokens`` positions of ``text`` (cut to
    tokens + 1 tokens: the first token is only context), each with its top ``top_k``."""

    tokens: int
    top_k: int
    text: str


@dataclass(frozen=True)
class TokenLogprob:
    id: int
    logprob: float


@dataclass(frozen=True)
class ForcedPosition:
    """One position: the text's token there, its log-probability given the tokens before
    it, and the engine's top-K there, most likely first."""

    token: int
    logprob: float
    top: tuple[TokenLogprob, ...]


@dataclass(frozen=True)
class TeacherForced:
    """A config's teacher-forced pass: the text's token ids as its engine split it, and
    ``positions[i]`` predicting ``token_ids[i + 1]``."""

    method: str  # FORCED_STEPS or PROMPT_LOGPROBS
    top_k: int
    token_ids: tuple[int, ...]
    positions: tuple[ForcedPosition, ...]


class TeacherForcedError(BenchmarkError):
    """An engine answer without the log-probabilities asked for (the quality cell names
    itself and what to do when it passes the error on)."""


# --- the requests and the parts of the answers the pass reads ------------------------------


@dataclass(frozen=True)
class LlamaTokenize:
    content: str
    add_special: bool = True


@dataclass(frozen=True)
class VllmTokenize:
    model: str
    prompt: str
    add_special_tokens: bool = True


@dataclass(frozen=True)
class Tokenized:
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class ForcedStep:
    """llama.cpp's /completion: one token after ``prompt``, the sampler forced to the
    text's next token, the probabilities those of the raw logits."""

    prompt: tuple[int, ...]
    n_probs: int
    logit_bias: tuple[tuple[int, float], ...]
    n_predict: int = 1
    temperature: float = 0
    cache_prompt: bool = True
    post_sampling_probs: bool = False


@dataclass(frozen=True)
class StepProbabilities:
    id: int
    logprob: float
    top_logprobs: tuple[TokenLogprob, ...]


@dataclass(frozen=True)
class StepAnswer:
    completion_probabilities: tuple[StepProbabilities, ...]


@dataclass(frozen=True)
class PromptLogprobsRequest:
    """vLLM's /v1/completions of the token ids, with their log-probabilities."""

    model: str
    prompt: tuple[int, ...]
    prompt_logprobs: int
    max_tokens: int = 1
    temperature: float = 0


@dataclass(frozen=True)
class RankedLogprob:
    logprob: float
    rank: int  # from 1


@dataclass(frozen=True)
class PromptChoice:
    prompt_logprobs: tuple[dict[str, RankedLogprob] | None, ...]  # by token id; None at position 0


@dataclass(frozen=True)
class PromptAnswer:
    choices: tuple[PromptChoice, ...]


Answer = TypeVar("Answer")


@dataclass(frozen=True)
class Engine:
    """The running engine the pass talks to."""

    base_url: str
    headers: Mapping[str, str]

    def post(self, path: str, request: object, answer: type[Answer]) -> Answer:
        body = json.dumps(codec.to_json(request)).encode()
        status, text = probe.http_post(self.base_url + path, REQUEST_TIMEOUT_S, self.headers, body)
        if status != 200:
            raise TeacherForcedError(f"POST {path}: HTTP {status or 'no answer'}: {text[:300]}")
        try:
            return codec.from_json(answer, json.loads(text))
        except (json.JSONDecodeError, cattrs.BaseValidationError, TypeError) as err:
            raise TeacherForcedError(f"POST {path}: not the answer asked for ({err}): {text[:300]}") from err


# --- the pass ----------------------------------------------------------------------------


def measure(engine: Engine, kind: str, model: str, settings: TeacherForcedSettings) -> TeacherForced:
    """The pass on a running engine of ``kind``; a TeacherForcedError says what went wrong."""
    method = engine_kind(kind).teacher_forcing
    if method == FORCED_STEPS:
        ids = engine.post("/tokenize", LlamaTokenize(settings.text), Tokenized).tokens[: settings.tokens + 1]
        positions = tuple(_forced_step(engine, ids[:i], ids[i], settings.top_k) for i in range(1, len(ids)))
    elif method == PROMPT_LOGPROBS:
        tokenize = VllmTokenize(model, settings.text)
        ids = engine.post("/tokenize", tokenize, Tokenized).tokens[: settings.tokens + 1]
        positions = _prompt_logprobs(engine, model, ids, settings.top_k)
    else:
        raise TeacherForcedError(f"the {kind} engine kind gives no teacher-forced log-probabilities")
    return TeacherForced(method, settings.top_k, ids, positions)


def _forced_step(engine: Engine, prefix: tuple[int, ...], token: int, top_k: int) -> ForcedPosition:
    """llama.cpp: the raw log-probabilities after ``prefix``, its sampler forced to ``token``."""
    request = ForcedStep(prompt=prefix, n_probs=top_k, logit_bias=((token, FORCING_BIAS),))
    steps = engine.post("/completion", request, StepAnswer).completion_probabilities
    if len(steps) != 1 or steps[0].id != token:
        chosen = [s.id for s in steps]
        raise TeacherForcedError(f"/completion sampled {chosen}, not the one forced token {token}")
    return ForcedPosition(token, steps[0].logprob, steps[0].top_logprobs)


def _prompt_logprobs(
    engine: Engine, model: str, ids: Sequence[int], top_k: int
) -> tuple[ForcedPosition, ...]:
    """vLLM: the prompt's log-probabilities, each position's entries keyed by token id,
    holding the top-K and the prompt's own token."""
    request = PromptLogprobsRequest(model, tuple(ids), top_k)
    choices = engine.post("/v1/completions", request, PromptAnswer).choices
    by_position = [e for e in (choices[0].prompt_logprobs[1:] if choices else ()) if e is not None]
    if len(by_position) != len(ids) - 1:
        found = f"{len(by_position)} prompt positions, not {len(ids) - 1}"
        raise TeacherForcedError(f"/v1/completions gave {found}")
    positions = []
    for token, entries in zip(ids[1:], by_position, strict=True):
        ranked = sorted((v.rank, int(k), v.logprob) for k, v in entries.items() if v.rank <= top_k)
        own = entries.get(str(token))
        if own is None:
            raise TeacherForcedError(f"/v1/completions' prompt_logprobs lack the prompt's token {token}")
        top = tuple(TokenLogprob(i, logprob) for _, i, logprob in ranked)
        positions.append(ForcedPosition(token, own.logprob, top))
    return tuple(positions)
