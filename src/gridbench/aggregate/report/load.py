"""The open-loop load section: each config's capacity under the SLO, and every load cell's
offered, sent and achieved rate with the client's schedule lag beside its SLO outcome."""

from __future__ import annotations

import pandas as pd

from gridbench.aggregate.load import Capacity, frame_capacities
from gridbench.aggregate.records import Row, missing
from gridbench.aggregate.report.markdown import code, table
from gridbench.aggregate.text import DASH, num, pct
from gridbench.aggregate.verdict import capacity_text, slo_words


def load_section(load: pd.DataFrame) -> str:
    slo = slo_words(load)
    if slo is None:
        return "No load cell was measured."
    load = load.astype(object)
    percentile = slo.percentile
    return "\n\n".join(
        [
            "Each cell sends its requests open loop at seeded arrival times, whatever the engine's "
            f"pace. A request meets the SLO when its {slo.targets}; a cell meets it when "
            f"{slo.attainment} of its requests or more do (a failed request misses it). A "
            "config's capacity is the highest rate meeting it below the lowest rate that misses "
            "it; without a failing rate it is a lower bound. Goodput counts only the requests "
            "meeting the SLO, over the time from the schedule's start to the last request's end.",
            table(
                (
                    "config",
                    "class",
                    "arrival",
                    "capacity (req/s)",
                    "goodput there (req/s)",
                    "goodput there (tok/s)",
                    "binding constraint",
                    "first failing rate (req/s)",
                    "saturated from (req/s)",
                ),
                [_capacity_row(cap) for cap in frame_capacities(load)],
            ),
            "Every cell: the offered rate, the rate the client sent at and the rate requests "
            "ended at (first to last), how late requests went out (lag behind the schedule, at "
            "p99) and the SLO outcome. The lag is split where it was recorded: the client's own, "
            "and the time the server took past the due time to accept the request's connection "
            "(an engine whose accept backlog is full drops the connection attempt, which the "
            "client's kernel resends a second later). Saturated: TTFT grew across the cell by "
            "more than its first quarter's median (a queue), or the cell ended early: a request had "
            "waited `load.saturation_wait_s` past its due time for its first token, so the "
            "requests in flight were stopped and the rest not sent (all missing the SLO).",
            table(
                (
                    "config",
                    "class",
                    "arrival",
                    "offered (req/s)",
                    "sent (req/s)",
                    "achieved (req/s)",
                    "schedule lag p99 (ms)",
                    "client lag p99 (ms)",
                    "accept wait p99 (ms)",
                    f"TTFT p{percentile} (ms)",
                    f"TPOT p{percentile} (ms)",
                    "meeting the SLO",
                    "saturated",
                ),
                [_cell_row(row) for row in load.to_dict("records")],
            ),
        ]
    )


def _capacity_row(cap: Capacity) -> tuple[object, ...]:
    return (
        code(cap.config),
        cap.prompt_class,
        cap.arrival,
        capacity_text(cap) if cap.capacity_req_s is not None else "none",
        num(cap.goodput_req_s),
        num(cap.goodput_tok_s),
        cap.binding_constraint or DASH,
        f"{cap.first_failing_req_s:g}" if cap.first_failing_req_s is not None else "none measured",
        f"{cap.saturated_from_req_s:g}" if cap.saturated_from_req_s is not None else "none measured",
    )


def _cell_row(row: Row) -> tuple[object, ...]:
    where = (code(row["config"]), row["prompt_class"], row["arrival"], f"{float(row['rate_req_s'] or 0):g}")
    if row["status"] != "ok":
        return (*where, f"failed: {row['reason']}", *[DASH] * 8)
    share = row["slo_attainment_share"]
    outcome = "met" if row["slo_met"] else "**missed**"
    met = DASH if missing(share) else f"{pct(float(share or 0))} ({outcome})"
    return (
        *where,
        num(row["sent_req_s"]),
        num(row["achieved_req_s"]),
        num(row["schedule_lag_ms_p99"]),
        num(row["client_lag_ms_p99"]),
        num(row["accept_wait_ms_p99"]),
        num(row["ttft_ms_at_slo_percentile"]),
        num(row["tpot_ms_at_slo_percentile"]),
        met,
        _saturated(row),
    )


def _saturated(row: Row) -> str:
    if not row["saturated"]:
        return "no"
    ended = row["ended_early_s"]
    return "yes" if missing(ended) else f"yes, ended early at {float(ended or 0):.1f} s"
