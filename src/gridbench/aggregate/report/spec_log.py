"""The report's cross-checks of the counters' acceptance: against vLLM's own log lines, and
cell by cell against the accepted tokens the client's stream shows."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from gridbench.aggregate.report.markdown import code, table
from gridbench.aggregate.spec_log import TOLERANCE, EngineRun, SpecLogComparison, cell_counters, compare
from gridbench.aggregate.stream_steps import StreamCheck, stream_checks
from gridbench.aggregate.text import DASH

METHOD = (
    "Per speculative config, the counters' acceptance at each draft position is Σ accepted ÷ "
    "Σ drafts over its measured depth and natural cells, and the log's is the same over every "
    "`SpecDecoding metrics` line of the engine runs that served them (a line's drafts are "
    "Drafted ÷ k, or where drafts can be shorter, as n-gram's, the count its Accepted, rates and "
    "mean acceptance length imply); the lines also count what ran outside the cells' windows "
    "(warm-ups, llama-benchy's coherence check, failed attempts) and miss each engine's last "
    f"interval, so agreement is within {TOLERANCE:g}, not the lines' rounding."
)

# where a config differs: what the two sides may have seen apart, before suspecting a counter
DIFFERS = (
    f"A difference beyond {TOLERANCE:g} says the log and the windows saw different requests: "
    "llama-benchy's coherence check (unless `benchy.skip_coherence`) drafts up to 100 tokens "
    "outside the window, sampled at the engine's default temperature, and a log that ended "
    "before its engine's last cells (drafts, log ÷ counters, well below 1) holds fewer of the "
    "measured ones."
)


def _rates(rates: Sequence[float]) -> str:
    return " ".join(f"{r:.3f}" for r in rates) if rates else DASH


def _row(c: SpecLogComparison) -> tuple[str, ...]:
    difference = f"{c.difference:.3f}"
    return (
        code(c.config),
        f"{c.runs} / {c.cells}",
        _rates(c.counters.rates),
        _rates(c.log.rates),
        f"{c.log.drafts / c.counters.drafts:.2f}",
        difference if c.agrees else f"**{difference}** (differs)",
    )


def spec_log_section(runs: Sequence[EngineRun], dataset: pd.DataFrame, natural: pd.DataFrame | None) -> str:
    """The counters' per-position acceptance beside the log lines', per config; nothing where no
    engine log has SpecDecoding lines or no measured cell ran on an engine that logged them."""
    comparisons = compare(runs, cell_counters(dataset) + cell_counters(natural))
    if not comparisons:
        return ""
    agreeing = sum(1 for c in comparisons if c.agrees)
    lead = (
        f"vLLM logs its own count of drafted and accepted tokens; {agreeing} of {len(comparisons)} "
        f"configs' counters agree with it within {TOLERANCE:g} at every draft position."
    )
    header = (
        "config",
        "engine runs / cells",
        "counters: per position",
        "log: per position",
        "drafts, log ÷ counters",
        "largest difference",
    )
    body = table(header, [_row(c) for c in comparisons])
    notes = [METHOD] if agreeing == len(comparisons) else [METHOD, DIFFERS]
    return "\n\n".join(["### Cross-check against vLLM's log", lead, body, *notes])


STREAM_METHOD = (
    "Accepted tokens from the stream: a cell's ok requests' output tokens after the first, less "
    "their text chunks after the first (the first is the prefill's), where the engine sends each "
    "step's tokens as one chunk: each later chunk is a target token and the drafts its step "
    "accepted. The counters' are the engine's own over the cell's window. They part only at a "
    "request's last step, where the counters also count drafted tokens accepted past the EOS or "
    "max_tokens that ended it and the EOS token streams no text: a cell agrees within k tokens "
    "a request."
)


def _stream_row(config: str, checks: list[StreamCheck]) -> tuple[str, ...]:
    largest = max(checks, key=lambda c: abs(c.difference))
    return (
        code(config),
        str(len(checks)),
        str(sum(c.counters for c in checks)),
        str(sum(c.stream for c in checks)),
        f"{largest.difference:+d} of ±{largest.bound} ({largest.prompt_class} c={largest.concurrency})",
        f"{sum(c.agrees for c in checks)} of {len(checks)}",
    )


def stream_section(natural: pd.DataFrame | None) -> str:
    """Per speculative config, its natural cells' accepted tokens by the counters and by the
    stream; nothing where no such cell was measured on an engine whose chunks are steps."""
    checks = stream_checks(natural)
    if not checks:
        return ""
    by_config: dict[str, list[StreamCheck]] = {}
    for check in checks:
        by_config.setdefault(check.config, []).append(check)
    lead = (
        "The client's stream counts the drafted tokens each step accepted: in "
        f"{sum(c.agrees for c in checks)} of {len(checks)} speculative natural cells it agrees "
        "with the counters within what the requests' last steps allow."
    )
    header = (
        "config",
        "cells",
        "accepted: counters",
        "accepted: stream",
        "largest difference, of its bound",
        "cells within",
    )
    body = table(header, [_stream_row(config, group) for config, group in by_config.items()])
    return "\n\n".join(["### Cross-check against the stream", lead, body, STREAM_METHOD])


def cross_checks(runs: Sequence[EngineRun], dataset: pd.DataFrame, natural: pd.DataFrame | None) -> str:
    """Both cross-checks of the counters' acceptance, those that have cells to check."""
    return "\n\n".join(
        part for part in (spec_log_section(runs, dataset, natural), stream_section(natural)) if part
    )
