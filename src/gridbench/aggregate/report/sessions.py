"""The multi-turn sessions section: per config, each turn's TTFT beside the share of its prompt
the engine took from its prefix cache, and whether the later turns' TTFT stays flat as the
resent history grows."""

from __future__ import annotations

import pandas as pd

from gridbench.aggregate.records import Row, optional_float
from gridbench.aggregate.report.markdown import code, table
from gridbench.aggregate.text import DASH, num, pct

# the last turn's TTFT within this factor of turn 1's counts as flat (below its inverse: falls)
FLAT_TTFT_RATIO = 1.5

INTRO = (
    "Each cell opens its conversations at once with the class's prompt (each behind a prefix of "
    "its own, so no two share a cache entry past the chat template's start); every later turn "
    "resends the whole history, the model's own answers included, with the next follow-up. The "
    "cells run on the config's engine with its prefix cache on. Cached share: of the turn's "
    "prompt tokens (summed over its answered requests), those the engine reports it took from its "
    "prefix cache; a dash where the engine reported no count (the reason is in the dataset's "
    "`cached_prompt_tokens_missing`)."
)


def sessions_section(sessions: pd.DataFrame) -> str:
    frame = sessions.astype(object)
    rows = frame.to_dict("records")
    if not any(row["status"] == "ok" for row in rows):
        return "No session cell was measured."
    cells: dict[tuple[str, str, int], list[Row]] = {}
    for row in rows:
        cells.setdefault((str(row["config"]), str(row["prompt_class"]), int(row["sessions"])), []).append(row)
    findings = [f"- {_finding(key, turns)}" for key, turns in cells.items()]
    return "\n\n".join(
        [
            INTRO,
            "\n".join(findings),
            table(
                (
                    "config",
                    "class",
                    "sessions",
                    "turn",
                    "answered",
                    "prompt tokens (mean)",
                    "cached share",
                    "TTFT p50 (ms)",
                    "TTFT max (ms)",
                    "decode tok/s p50",
                ),
                [_turn_row(row) for row in rows],
            ),
        ]
    )


def _finding(key: tuple[str, str, int], turns: list[Row]) -> str:
    """Whether the cell's last turn answered about as fast as its first, and the cache's part."""
    config, prompt_class, sessions = key
    where = f"{code(config)} {prompt_class}, {sessions} at once"
    if turns[0]["status"] != "ok":
        return f"{where}: failed ({turns[0]['reason']})"
    first, last = turns[0], turns[-1]
    first_ttft, last_ttft = optional_float(first["ttft_ms_p50"]), optional_float(last["ttft_ms_p50"])
    if first_ttft is None or last_ttft is None:
        return f"{where}: no TTFT at turn 1 or turn {last['turn']} (no conversation answered it)"
    ratio = last_ttft / first_ttft
    grown = (optional_float(last["prompt_tokens_mean"]) or 0) / (
        optional_float(first["prompt_tokens_mean"]) or 1
    )
    share = optional_float(last["cached_prompt_share"])
    cache = "the engine reported no cached tokens" if share is None else f"{pct(share)} of it cached"
    flat = ratio <= FLAT_TTFT_RATIO
    trend = "falls" if ratio < 1 / FLAT_TTFT_RATIO else "stays flat" if flat else "rises"
    because = " thanks to the cache" if flat and share is not None and share > 0.5 else ""
    return (
        f"{where}: by turn {last['turn']} the prompt is {grown:.1f}× turn 1's ({cache}), and TTFT p50 "
        f"{trend}{because}: {num(first_ttft)} → {num(last_ttft)} ms ({ratio:.2f}×)"
    )


def _turn_row(row: Row) -> tuple[object, ...]:
    where = (code(row["config"]), row["prompt_class"], row["sessions"], row["turn"])
    if row["status"] != "ok":
        return (*where, f"failed: {row['reason']}", *[DASH] * 5)
    share = optional_float(row["cached_prompt_share"])
    return (
        *where,
        f"{row['ok']} of {row['sessions']}",
        num(row["prompt_tokens_mean"]),
        DASH if share is None else pct(share),
        num(row["ttft_ms_p50"]),
        num(row["ttft_ms_max"]),
        num(row["decode_tok_s_p50"]),
    )
