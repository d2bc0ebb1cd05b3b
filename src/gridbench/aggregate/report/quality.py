"""The quality section: each config's greedy agreement with its reference beside its decode
speed over the reference's, the speed–quality frontier, and speculation's losslessness."""

from __future__ import annotations

import pandas as pd

from gridbench.aggregate.quality import NEAR_TIE_NATS, TOKENS, SpeedQuality, speed_quality
from gridbench.aggregate.records import Row, integer, missing
from gridbench.aggregate.report.markdown import code, table
from gridbench.aggregate.text import DASH, and_list, num, ratio_text


def quality_section(quality: pd.DataFrame, dataset: pd.DataFrame) -> str:
    points = {p.config: p for p in speed_quality(quality, dataset)}
    rows = [_row(row, points.get(row["config"])) for row in quality.to_dict("records")]
    header = (
        "config",
        "reference",
        "prompts",
        "identical outputs",
        "first difference (mean)",
        "matching positions",
        "KL divergence (mean, nats/token)",
        "top-1 agreement",
        "perplexity (reference's)",
        "decode ÷ reference",
        "lossless vs baseline",
    )
    return "\n\n".join(
        [
            "Greedy outputs (temperature 0) of the quality prompts, each config against its "
            "reference: the same weights at the highest precision measured, without speculation "
            "(or `quality.reference`). A first difference counts positions from 0, over the "
            "prompts that differ; matching positions are of the longer output's. Decode is the "
            "depth sweep's, at the shallowest depth both measured.",
            _teacher_forced_method(quality),
            table(header, rows),
            _frontier_text(list(points.values())),
        ]
    )


def _row(row: Row, point: SpeedQuality | None) -> tuple[object, ...]:
    config = code(row["config"])
    if row["status"] != "ok":
        return (config, DASH, DASH, f"failed: {row['reason']}", *[DASH] * 7)
    unit = "tokens" if row["agreement_unit"] == TOKENS else "chars"
    first = row["first_difference_mean_tokens"] if unit == "tokens" else row["first_difference_mean_chars"]
    matching = row["token_match_pct"] if unit == "tokens" else row["char_match_pct"]
    return (
        config,
        code(row["reference"]) if not missing(row["reference"]) else row["agreement_note"],
        row["agreement_prompts"],
        f"{num(row['identical_outputs_pct'], 0)} %" if not missing(row["identical_outputs_pct"]) else DASH,
        f"{num(first, 1)} {unit}" if not missing(first) else DASH,
        f"{num(matching, 1)} % of {unit}" if not missing(matching) else DASH,
        *_teacher_forced_cells(row),
        f"{ratio_text(point.speedup.speedup)} @{point.speedup.depth}" if point and point.speedup else DASH,
        _lossless_text(row),
    )


def _teacher_forced_method(quality: pd.DataFrame) -> str:
    if "kl_divergence_mean" not in quality or quality["kl_divergence_mean"].isna().all():
        return "No teacher-forced pass over the held-out text (quality.teacher_forced_tokens)."
    return (
        "Teacher-forced: the packaged held-out text (the Gettysburg Address), tokenized by each "
        "config's engine, scored position by position on the same tokens as the reference "
        "(llama.cpp: one /completion per position, its next token forced by logit_bias, the "
        "raw logits' log-probabilities; vLLM: prompt_logprobs). KL(reference ‖ config) is over "
        "the reference's top-K tokens plus one bucket for every other token; a token the config "
        "did not return gets its unreturned mass spread over such tokens and the bucket, capped "
        "at its K-th probability, so the figure is a lower bound of the full-vocabulary KL "
        "where the config's numbers are exact. Top-1 agreement: positions whose most likely "
        "token is the reference's; perplexity: exp(−mean log-probability of the text's tokens)."
    )


def _teacher_forced_cells(row: Row) -> tuple[str, str, str]:
    if missing(row.get("kl_divergence_mean")):
        note = row.get("teacher_forced_note")
        return (DASH if missing(note) else str(note), DASH, DASH)
    return (
        f"{num(row['kl_divergence_mean'], 4)} (p99 {num(row['kl_divergence_p99'], 3)}, "
        f"K={integer(row['teacher_forced_top_k'])}, {integer(row['teacher_forced_tokens'])} tokens)",
        f"{num(row['top1_agreement_pct'], 1)} %",
        f"{num(row['perplexity'], 2)} ({num(row['reference_perplexity'], 2)})",
    )


def _lossless_text(row: Row) -> str:
    if missing(row["baseline"]):
        return DASH
    if missing(row["lossless_prompts"]):
        return str(row["lossless_note"])
    mismatches, prompts = integer(row["lossless_mismatches"]), integer(row["lossless_prompts"])
    if mismatches == 0:
        return f"yes: {prompts} of {prompts} equal `{row['baseline']}`'s"
    where = row["lossless_mismatched_classes"]
    beyond_ties = row.get("lossless_mismatches_beyond_ties")
    if not missing(beyond_ties) and integer(beyond_ties) == 0:
        return (
            f"yes, up to rounding: {mismatches} of {prompts} part from `{row['baseline']}`'s at a "
            f"near-tie of its (under {NEAR_TIE_NATS} nats: {where})"
        )
    return f"**no**: {mismatches} of {prompts} differ from `{row['baseline']}`'s ({where})"


def _frontier_text(points: list[SpeedQuality]) -> str:
    timed = [p for p in points if p.speedup is not None]
    if all(p.config == p.reference for p in timed):
        return (
            "No speed–quality frontier: no config other than a reference has both quality "
            "results and a decode speed measured at a depth its reference measured too."
        )
    frontier = [f"`{p.config}` ({_speed(p)}, {p.agreement_pct:.0f} %)" for p in timed if p.on_frontier]
    dominated = [f"`{p.config}`" for p in timed if not p.on_frontier]
    text = (
        "On the speed–quality frontier (no other config is both faster and closer to its "
        f"reference): {and_list(frontier)}."
    )
    if dominated:
        text += f" Beaten on both by another config: {and_list(dominated)}."
    return text


def _speed(point: SpeedQuality) -> str:
    return DASH if point.speedup is None else f"{point.speedup.speedup.mean:.2f}×"
