"""The report's energy and cost: joules and dollars per output token beside throughput, for
the cells whose GPUs were sampled (cells.telemetry), and why the others have none."""

from __future__ import annotations

import statistics

import pandas as pd

from gridbench.aggregate import analysis
from gridbench.aggregate.records import missing
from gridbench.aggregate.report.markdown import code, table
from gridbench.aggregate.text import num
from gridbench.cells.telemetry import DEFAULT_INTERVAL_S
from gridbench.config.grid import StudyInfo

# what the section reads of a measured row, whichever dataset it comes from
_COLUMNS = (
    "config",
    "cell",
    "tok_s",
    "power_w_mean",
    "energy_j",
    "energy_source",
    "energy_j_integrated",
    "joules_per_output_token",
    "output_tokens_per_kwh",
    "usd_per_million_output_tokens",
    "telemetry_note",
)
NO_REASON = "no reason recorded (a dataset built before gridbench had energy columns: rebuild it)"


def measured_cells(dataset: pd.DataFrame, natural: pd.DataFrame | None) -> pd.DataFrame:
    """The measured depth and natural cells, each with a label and its throughput (decode
    tok/s at a depth, output tok/s of a natural level) beside its energy columns."""
    depth = analysis.measured(dataset)
    parts = [_cells(depth, [f"depth {d}" for d in depth["context_tokens"]], depth["decode_tps"])]
    if natural is not None:
        ok = analysis.measured(natural)
        labels = [f"{c} @ c{n}" for c, n in zip(ok["prompt_class"], ok["concurrency"], strict=True)]
        parts.append(_cells(ok, labels, ok["output_tok_s"]))
    return pd.concat(parts, ignore_index=True)


def _cells(frame: pd.DataFrame, labels: list[str], tok_s: pd.Series) -> pd.DataFrame:
    """The section's columns of ``frame``, taken before the two are added: a dataset's
    hundred nullable columns are a hundred blocks, which pandas warns of on every insert."""
    own = frame.reindex(columns=[c for c in _COLUMNS if c not in ("cell", "tok_s")])
    return own.assign(cell=labels, tok_s=tok_s).reindex(columns=list(_COLUMNS))


def _with_energy(cells: pd.DataFrame) -> pd.DataFrame:
    return cells[[not missing(v) for v in cells["energy_j"]]]


def _reasons(cells: pd.DataFrame) -> str:
    """Why cells have no energy, each reason once with how many cells give it."""
    notes = [NO_REASON if missing(n) else str(n) for n in cells["telemetry_note"]]
    counts = {note: notes.count(note) for note in dict.fromkeys(notes)}
    return "\n".join(f"- {n} cell{'' if n == 1 else 's'}: {note}" for note, n in counts.items())


def agreement_line(cells: pd.DataFrame) -> str | None:
    """How the sampled power's integral compares with the energy counter, over the cells that
    have both; None where none has."""
    integrated = pd.Series([not missing(v) for v in cells["energy_j_integrated"]], index=cells.index)
    both = cells[(cells["energy_source"] == "counter") & integrated]
    ratios = sorted(
        float(i) / float(c) for c, i in zip(both["energy_j"], both["energy_j_integrated"], strict=True)
    )
    if not ratios:
        return None
    low, high = num(ratios[0], 3), num(ratios[-1], 3)
    return (
        f"over the {len(ratios)} cell{'' if len(ratios) == 1 else 's'} with both, the integral ÷ the "
        f"counter is {num(statistics.median(ratios), 3)} (median; range {low}–{high})"
    )


def price_text(study: StudyInfo) -> str:
    price = study.hardware.gpu_hour_usd
    if price is None:
        return "`study.hardware.gpu_hour_usd` is not set: no cost per token"
    return (
        f"cost per million output tokens prices the cell's GPUs over its window at "
        f"${price:g} per GPU-hour (`study.hardware.gpu_hour_usd`, the study's own assumption: no "
        "other cost — host, power, idle engines, engine starts — is in it)"
    )


def method_line(dataset: pd.DataFrame, natural: pd.DataFrame | None, study: StudyInfo) -> str | None:
    """The method's one statement on energy; None where no cell has any (the section says why)."""
    cells = _with_energy(measured_cells(dataset, natural))
    if cells.empty:
        return None
    agreement = agreement_line(cells)
    return (
        f"- Energy: each cell's GPUs sampled through NVML every {DEFAULT_INTERVAL_S:g} s over its whole "
        "measurement (warm-up included); energy is the GPUs' energy counter read before and after "
        "where they have one, else the sampled power integrated by trapezoids"
        f"{f' ({agreement})' if agreement else ''}. Per output token: over the output tokens of the "
        "cell's measured requests (warm-up tokens are not counted, so a value leans high); "
        f"{price_text(study)}."
    )


def _row(cell: pd.Series) -> tuple[str, ...]:
    source = "" if missing(cell["energy_source"]) else f" ({cell['energy_source']})"
    return (
        code(cell["config"]),
        str(cell["cell"]),
        num(cell["tok_s"]),
        num(cell["power_w_mean"]),
        num(cell["energy_j"], 0) + source,
        num(cell["joules_per_output_token"], 3),
        num(cell["output_tokens_per_kwh"], 0),
        num(cell["usd_per_million_output_tokens"], 3),
    )


def energy_section(dataset: pd.DataFrame, natural: pd.DataFrame | None, study: StudyInfo) -> str:
    cells = measured_cells(dataset, natural)
    if cells.empty:
        return "No cell was measured."
    sampled = _with_energy(cells)
    missing_cells = cells.drop(index=sampled.index)
    if sampled.empty:
        return (
            "No GPU telemetry was recorded for any measured cell, so there is no energy or cost per "
            f"output token. Why, from the cells' provenance:\n\n{_reasons(missing_cells)}"
        )
    header = (
        "config",
        "cell",
        "tok/s",
        "power (W)",
        "energy (J)",
        "J per output token",
        "output tokens per kWh",
        "$ per M output tokens",
    )
    parts = [
        "Energy over each measured cell's window (the method says how) beside its throughput: "
        "decode tok/s at a depth, output tok/s of a natural level.",
        table(header, [_row(cell) for _, cell in sampled.iterrows()]),
    ]
    if study.hardware.gpu_hour_usd is None:
        parts.append(f"{price_text(study)}.")
    if not missing_cells.empty:
        parts.append(f"Measured cells without energy, left out of the table:\n\n{_reasons(missing_cells)}")
    return "\n\n".join(parts)
