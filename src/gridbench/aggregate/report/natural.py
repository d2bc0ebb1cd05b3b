"""The natural-prompt matrix's sections: the matrix, capacity under latency targets, the
Pareto frontier."""

from __future__ import annotations

import pandas as pd

from gridbench.aggregate import analysis
from gridbench.aggregate.records import Row, missing
from gridbench.aggregate.report.markdown import code, table
from gridbench.aggregate.text import DASH, num, pct
from gridbench.aggregate.verdict import (
    capacity_targets,
    targets_text,
)
from gridbench.config.grid import StudyInfo

POSITIONS_SHOWN = 4


def natural_section(natural: pd.DataFrame | None) -> str:
    if natural is None:
        return "No natural-prompt cell was measured."
    blocks = []
    for config in analysis.config_order(natural):
        mine = natural[natural["config"] == config]
        rows = []
        for row in mine.to_dict("records"):
            if row["status"] != "ok":
                rows.append((row["prompt_class"], row["concurrency"], row["status"], *[DASH] * 10))
                continue
            acceptance = pct(row["acceptance_rate"]) if not missing(row["acceptance_rate"]) else DASH
            rows.append(
                (
                    row["prompt_class"],
                    row["concurrency"],
                    num(row["output_tok_s"]),
                    num(row["req_tok_s_p50"]),
                    num(row["ttft_ms_p50"], 0),
                    num(row["ttft_ms_p95"], 0),
                    num(row["tpot_ms_p50"], 1),
                    num(row["tpot_ms_p95"], 1),
                    num(row["output_tokens_p50"], 0),
                    _eos_text(row),
                    num(row["wall_s"], 1),
                    f"{row['ok']} / {row['errored']} / {row['incomplete']}",
                    acceptance,
                )
            )
        label = mine["config_label"].iloc[0]
        block = f"### `{config}`: {label}\n\n" + table(
            (
                "class",
                "c",
                "agg tok/s",
                "per-req p50 (tok/s)",
                "TTFT p50 (ms)",
                "TTFT p95 (ms)",
                "TPOT p50 (ms)",
                "TPOT p95 (ms)",
                "median out (tokens)",
                "ended on EOS",
                "wall (s)",
                "ok / errored / incomplete",
                "acceptance",
            ),
            rows,
        )
        warnings = sorted(set("; ".join(mine["percentile_warnings"].dropna()).split("; ")) - {""})
        if warnings:
            block += "\n\nPercentile warnings: " + "; ".join(warnings) + "."
        blocks.append(block)
    return "\n\n".join(blocks)


def _eos_text(row: Row) -> str:
    eos = row.get("ended_on_eos")
    return DASH if eos is None or missing(eos) else f"{int(eos)} of {row['ok']}"


def workload_class_section(natural: pd.DataFrame | None) -> str:
    """Seed 000's workload-class reality check: each speculative config's acceptance and
    speed-up by prompt class, side by side, with how the class's answers ended."""
    if natural is None:
        return "No natural-prompt cell was measured."
    levels = analysis.class_acceptance(natural)
    if not levels:
        return "No speculative config measured a natural-prompt cell."
    rows = [
        (
            code(lv.config),
            lv.prompt_class,
            lv.concurrency,
            pct(lv.acceptance_rate) if lv.acceptance_rate is not None else DASH,
            num(lv.mean_acceptance_length, 2) if lv.mean_acceptance_length is not None else DASH,
            " ".join(pct(rate) for rate in lv.per_position[:POSITIONS_SHOWN]) or DASH,
            num(lv.output_tok_s),
            f"{num(lv.speedup, 2)}x over {code(lv.baseline)}" if lv.speedup is not None else DASH,
            DASH if lv.output_tokens_p50 is None else f"{num(lv.output_tokens_p50, 0)} of {lv.max_tokens}",
            f"{lv.ended_on_eos} of {lv.ok}" if lv.ended_on_eos is not None else DASH,
        )
        for lv in levels
    ]
    lines = [
        f"`{config}` at c={concurrency}: acceptance {pct(best[0].acceptance_rate or 0.0)} on "
        f"{best[0].prompt_class} down to {pct(best[-1].acceptance_rate or 0.0)} on {best[-1].prompt_class}."
        for (config, concurrency), best in analysis.acceptance_spread(levels).items()
    ]
    return (
        "A tok/s figure means little without the workload that produced it: acceptance by prompt "
        "class, from the engine's counters over each cell's measured requests; the speed-up is "
        "against the same checkpoint and engine without speculation, same class and level.\n\n"
        + table(
            (
                "config",
                "class",
                "c",
                "acceptance",
                "mean acceptance length",
                f"per position (first {POSITIONS_SHOWN})",
                "agg tok/s",
                "speed-up",
                "median out (tokens)",
                "ended on EOS",
            ),
            rows,
        )
        + ("\n\n" + "\n".join(f"- {line}" for line in lines) if lines else "")
    )


def capacity_section(natural: pd.DataFrame | None, study: StudyInfo) -> str:
    targets = capacity_targets(study)
    if not targets:
        return (
            "No latency targets set (`study.capacity.ttft_ms_p50`, `study.capacity.tpot_ms_p50`): "
            "no capacity table."
        )
    if natural is None:
        return "No natural-prompt cell was measured."
    rows = []
    for cap in analysis.capacities(natural, targets):
        best = cap.best
        miss = cap.first_miss
        rows.append(
            (
                code(cap.config),
                cap.prompt_class,
                cap.concurrency if cap.concurrency else "none",
                num(best.output_tok_s) if best else DASH,
                num(best.ttft_ms_p50, 0) if best else DASH,
                num(best.tpot_ms_p50, 1) if best else DASH,
                f"c={miss.concurrency}: TTFT p50 {num(miss.ttft_ms_p50, 0)} ms, "
                f"TPOT p50 {num(miss.tpot_ms_p50, 1)} ms"
                if miss
                else "none measured",
            )
        )
    return f"Highest concurrency whose medians meet {targets_text(targets)} (`study.capacity`):\n\n" + table(
        (
            "config",
            "class",
            "highest c",
            "agg tok/s there",
            "TTFT p50 (ms)",
            "TPOT p50 (ms)",
            "lowest level that misses",
        ),
        rows,
    )


def pareto_section(natural: pd.DataFrame | None, study: StudyInfo) -> str:
    if natural is None:
        return "No natural-prompt cell was measured."
    targets = capacity_targets(study)
    points = analysis.pareto_points(natural, targets)
    frontier = sorted((p for p in points if p.on_frontier), key=lambda p: (p.prompt_class, -p.per_user_tok_s))
    if not frontier:
        return "No natural-prompt level was measured."
    meets = f"meets {targets_text(targets)}" if targets else "meets targets (none set)"
    return (
        "Every measured (config, concurrency) level is a point: per-user output tok/s (p50 over its "
        "requests) against aggregate output tok/s per GPU (the config's GPUs; 1 on a CPU). A level is "
        "on the frontier when no other level of its prompt class is at least as good on both and "
        f"better on one; from the most interactive to the most throughput ({len(frontier)} of "
        f"{len(points)} levels):\n\n"
        + table(
            (
                "class",
                "config",
                "c",
                "per-user tok/s",
                "tok/s per GPU",
                "TTFT p50 (ms)",
                "TPOT p50 (ms)",
                meets,
            ),
            (
                (
                    p.prompt_class,
                    code(p.config),
                    p.concurrency,
                    num(p.per_user_tok_s),
                    num(p.tok_s_per_gpu),
                    num(p.ttft_ms_p50, 0) if p.ttft_ms_p50 is not None else DASH,
                    num(p.tpot_ms_p50, 1) if p.tpot_ms_p50 is not None else DASH,
                    DASH if p.meets_targets is None else ("yes" if p.meets_targets else "no"),
                )
                for p in frontier
            ),
        )
    )
