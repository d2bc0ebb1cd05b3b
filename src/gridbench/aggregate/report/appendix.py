"""The report's end: failed and skipped cells, the graphs, the full data."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from gridbench import layout
from gridbench.aggregate import analysis
from gridbench.aggregate.analysis import Measure
from gridbench.aggregate.records import missing
from gridbench.aggregate.report.markdown import code, table
from gridbench.aggregate.text import DASH, pct, pm


def failures_section(dataset: pd.DataFrame, natural: pd.DataFrame | None) -> str:
    rows = []
    for row in dataset[dataset["status"] != "ok"].to_dict("records"):
        rows.append(
            (
                code(row["config"]),
                f"depth {row['context_tokens']}",
                row["status"],
                row["reason"],
                code(row["log_path"]),
            )
        )
    cached = analysis.with_cached(dataset)
    for row in cached[cached["cached_status"] == "failed"].to_dict("records"):
        rows.append(
            (
                code(row["config"]),
                f"depth {row['context_tokens']} (cached context)",
                "failed",
                row["cached_reason"],
                code(row["cached_log_path"]),
            )
        )
    if natural is not None:
        for row in natural[natural["status"] != "ok"].to_dict("records"):
            rows.append(
                (
                    code(row["config"]),
                    f"{row['prompt_class']} c={row['concurrency']}",
                    row["status"],
                    row["reason"],
                    code(row["log_path"]),
                )
            )
    if not rows:
        return "None: every scheduled cell was measured."
    return table(("config", "cell", "status", "reason", "log"), rows)


def graphs_section(graphs: Sequence[str]) -> str:
    if not graphs:
        return "No graphs were drawn."
    blocks = []
    for link in graphs:
        name = link.rsplit("/", 1)[-1].removesuffix(".png")
        blocks.append(f"### {layout.GRAPH_TITLES.get(name, name)}\n\n![{name}]({link})")
    return "\n\n".join(blocks)


def full_data(dataset: pd.DataFrame) -> str:
    ok = analysis.measured(dataset)
    if ok.empty:
        return "No depth cell was measured."
    rows = []
    for row in ok.to_dict("records"):
        rows.append(
            (
                code(row["config"]),
                row["context_tokens"],
                pm(Measure.of(row["prefill_tps"], row["prefill_tps_std"])),
                pm(Measure.of(row["decode_tps"], row["decode_tps_std"])),
                pm(Measure.of(row["peak_tps"], row["peak_tps_std"])),
                pm(Measure.of(row["ttft_ms"], row["ttft_ms_std"])),
                pct(row["acceptance_rate"]) if not missing(row["acceptance_rate"]) else DASH,
            )
        )
    return table(
        ("config", "depth", "prefill tok/s", "decode tok/s", "peak tok/s", "TTFT (ms)", "acceptance"), rows
    )
