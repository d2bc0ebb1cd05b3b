"""The report's GPU time: what share of the time the engines held the GPUs measured something."""

from __future__ import annotations

from gridbench.aggregate.ledger import GpuLedger, LedgerTotals
from gridbench.aggregate.report.markdown import table
from gridbench.aggregate.text import num, pct

METHOD_LINE = (
    "- GPU time: each engine's life, from its start event to its stop "
    "(`logs/engines/events.jsonl`), split into its start-up (start to ready; a start that never "
    "got ready is a failed start), the cells it served — the load generator's measured run "
    "(`bench.wall_s` of the cell's provenance) and the rest of the cell (warm-up, cache reset, "
    "counters, the command's start-up) — the time it was up with no cell running (idle), and for a "
    "sweep's last engine the time after its last cell until the sweep stopped it (datasets, "
    "graphs and report). An engine on several GPUs counts once per GPU."
)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _share(part: float, ledger: GpuLedger) -> str:
    held = ledger.totals.held_s
    return pct(part / held) if held > 0 else "—"


def _unit(ledger: GpuLedger) -> tuple[str, float]:
    """GPU-minutes, or GPU-seconds for a sweep shorter than ten minutes (a CPU check)."""
    return ("GPU-minutes", 60.0) if ledger.totals.held_s >= 600 else ("GPU-seconds", 1.0)


def _amount(seconds: float, ledger: GpuLedger) -> str:
    return num(seconds / _unit(ledger)[1], 1)


def _rows(ledger: GpuLedger) -> list[tuple[str, str, str, str]]:
    t = ledger.totals
    parts = [
        (f"engine starts ({ledger.starts})", t.engine_start_s, "start to ready"),
        (f"failed starts ({ledger.failed_starts})", t.failed_start_s, "starts that never got ready"),
        (
            f"measurement ({ledger.cells} cell{'' if ledger.cells == 1 else 's'})",
            t.measurement_s,
            "the load generators' measured runs",
        ),
        ("rest of the cells", t.cell_overhead_s, "warm-up, cache reset, counters, command start-up"),
        (f"failed cells ({ledger.failed_cells})", t.failed_cell_s, "cells on a ready engine that failed"),
        ("idle between cells", t.idle_s, "engine up, no cell running"),
        ("sweep's end", t.sweep_end_s, "after the last cell until the sweep stopped the engine"),
    ]
    rows = [
        (name, _amount(s, ledger), _share(s, ledger), what)
        for name, s, what in parts
        if s > 0 or "measure" in name
    ]
    rows.append(("**engine-held total**", f"**{_amount(t.held_s, ledger)}**", "100 %", ""))
    return rows


def _without_failed_starts(t: LedgerTotals) -> float | None:
    rest = t.held_s - t.failed_start_s
    return t.measurement_s / rest if rest > 0 and t.failed_start_s > 0 else None


def _notes(ledger: GpuLedger) -> list[str]:
    notes = []
    rest = _without_failed_starts(ledger.totals)
    if rest is not None:
        notes.append(
            f"Without the {_count(ledger.failed_starts, 'failed start')} (a set-up fault, or a start that "
            f"the sweep's stop cut short: not what the study costs once it runs), measurement is {pct(rest)} "
            "of the held time."
        )
    if ledger.open_engines:
        notes.append(
            f"{_count(ledger.open_engines, 'engine')} had no stop recorded when this was written (the "
            "sweep's last engine is stopped after the report): its time ends at its last cell."
        )
    if ledger.unplaced_cells:
        notes.append(
            f"{ledger.unplaced_cells} measured cells ran on no engine these events record (their "
            "machine's events file is not here): their time is not in the ledger."
        )
    if ledger.unheld_s > 0:
        notes.append(
            f"Between the first engine start and the last stop, the GPUs also spent "
            f"{_amount(ledger.unheld_s, ledger)} {_unit(ledger)[0]} with no engine up (between runs "
            "of the sweep), not counted above."
        )
    return notes


def ledger_section(ledger: GpuLedger) -> str:
    if ledger.totals.held_s <= 0:
        return "No engine events were recorded (`logs/engines/events.jsonl`): no GPU time to account for."
    share = ledger.measured_share or 0.0
    lead = (
        f"Of the {_amount(ledger.totals.held_s, ledger)} {_unit(ledger)[0]} the engines held, **{pct(share)} "
        "measured cells** (the load generators' measured runs)."
    )
    body = table(("part", _unit(ledger)[0], "share", "what"), _rows(ledger))
    return "\n\n".join([lead, body, *_notes(ledger)])


def ledger_verdict_line(ledger: GpuLedger) -> str | None:
    t = ledger.totals
    if t.held_s <= 0:
        return None
    line = (
        f"GPU time: {pct(ledger.measured_share or 0.0)} of the engines' {_amount(t.held_s, ledger)} "
        f"{_unit(ledger)[0]} measured cells; {_count(ledger.starts, 'engine start')} took "
        f"{_share(t.engine_start_s, ledger)}"
    )
    if ledger.failed_starts:
        line += f" and {_count(ledger.failed_starts, 'failed start')} {_share(t.failed_start_s, ledger)}"
    return line + " ([GPU time](#gpu-time))."
