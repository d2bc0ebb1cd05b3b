"""Teacher-forced divergence of a config from its reference, as llama.cpp's
``llama-perplexity --kl-divergence`` report gives it: mean and 99th-percentile KL divergence
per token, top-1 agreement, and each side's perplexity, over the same token sequence. Pure.

Engines return only the top-K log-probabilities of each position, so the KL divergence is
that of two distributions over the reference's top-K tokens plus one "rest" bucket (every
other token):

- the reference's side is exact: p(t) for its top-K tokens, p(rest) = 1 − their sum;
- the config's side: q(t) is the config's own probability where it returned one for t (its
  top-K, or the text's token, whose probability it always returns); a token of the
  reference's top-K that the config did not return gets the config's unreturned mass
  (1 − what it returned) spread evenly over those tokens and the rest bucket, capped at the
  config's K-th probability (it ranked below that); q(rest) = 1 − Σ q(t).

KL(ref ‖ cfg) = Σ p log(p / q) over these K + 1 buckets. Merging tokens into a bucket never
raises a KL divergence, so where the config's numbers are exact this is a lower bound of the
full-vocabulary one, and equal to it where K covers the vocabulary. The reference against
itself gives 0 at every position.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gridbench.harness.teacher_forced import ForcedPosition, TeacherForced

# a probability no bucket falls below, so that log(p / q) stays finite
FLOOR = 1e-12


def position_kl(reference: ForcedPosition, config: ForcedPosition) -> float:
    """KL(ref ‖ cfg) at one position, over the reference's top-K and a rest bucket (the
    module's rule)."""
    p = {t.id: math.exp(t.logprob) for t in reference.top}
    known = {t.id: math.exp(t.logprob) for t in config.top}
    known[config.token] = math.exp(config.logprob)
    unknown = [t for t in p if t not in known]
    if unknown:
        unreturned = max(0.0, 1.0 - sum(known.values()))
        cap = min((math.exp(t.logprob) for t in config.top), default=unreturned)
        share = min(unreturned / (len(unknown) + 1), cap)
        known.update(dict.fromkeys(unknown, share))
    q = {t: max(known[t], FLOOR) for t in p}
    p_rest = max(0.0, 1.0 - sum(p.values()))
    q_rest = max(1.0 - sum(q.values()), FLOOR)
    kl = sum(pt * math.log(pt / q[t]) for t, pt in p.items() if pt > 0)
    if p_rest > 0:
        kl += p_rest * math.log(p_rest / q_rest)
    return max(kl, 0.0)


def perplexity(positions: Sequence[ForcedPosition]) -> float | None:
    """exp(−mean log-probability of the text's tokens); None without positions."""
    if not positions:
        return None
    return math.exp(-sum(p.logprob for p in positions) / len(positions))


@dataclass(frozen=True)
class TeacherForcedDivergence:
    """A config's teacher-forced pass against its reference's, over the same tokens."""

    tokens: int  # positions compared
    kl_mean: float
    kl_p99: float
    top1_agreement: float  # share of positions whose most likely token is the same, 0..1
    perplexity: float
    reference_perplexity: float


class DifferentTokens(ValueError):
    """The two passes scored different token sequences: nothing to compare."""


def teacher_forced_divergence(config: TeacherForced, reference: TeacherForced) -> TeacherForcedDivergence:
    """Position by position; DifferentTokens where the engines split the text differently
    (or scored a different number of its tokens)."""
    if config.token_ids != reference.token_ids or not config.positions:
        raise DifferentTokens(
            f"{len(config.token_ids)} and {len(reference.token_ids)} tokens, "
            f"{'equal' if config.token_ids == reference.token_ids else 'not the same'} ids"
        )
    pairs = list(zip(reference.positions, config.positions, strict=True))
    kls = np.array([position_kl(r, c) for r, c in pairs])
    same_top = [bool(r.top and c.top and r.top[0].id == c.top[0].id) for r, c in pairs]
    return TeacherForcedDivergence(
        tokens=len(pairs),
        kl_mean=float(kls.mean()),
        kl_p99=float(np.quantile(kls, 0.99)),
        top1_agreement=sum(same_top) / len(pairs),
        perplexity=perplexity(config.positions) or math.nan,
        reference_perplexity=perplexity(reference.positions) or math.nan,
    )
