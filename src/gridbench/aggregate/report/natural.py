"""The natural-prompt matrix's sections: the matrix, capacity under latency targets, the
Pareto frontier."""

from __future__ import annotations

import pandas as pd

from gridbench.aggregate import analysis
from gridbench.aggregate.records import missing
from gridbench.aggregate.report.markdown import code, table
from gridbench.aggregate.text import DASH, num, pct
from gridbench.aggregate.verdict import (
    capacity_targets,
    targets_text,
)
from gridbench.grid import StudyInfo


def natural_section(natural: pd.DataFrame | None) -> str:
    if natural is None:
        return "No natural-prompt cell was measured."
    blocks = []
    for config in analysis.config_order(natural):
        mine = natural[natural["config"] == config]
        rows = []
        for row in mine.to_dict("records"):
            if row["status"] != "ok":
                rows.append((row["prompt_class"], row["concurrency"], row["status"], *[DASH] * 9))
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
