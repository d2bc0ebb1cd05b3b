"""The quality dataset: one row per config, its greedy outputs (the quality cells' raw JSON,
schema ``gridbench.quality.v2``, or ``v1`` without a teacher-forced pass) compared prompt by prompt

- with its reference: the study's ``quality.reference``, else the config on the same engine
  serving the same weights in the most bytes per token without speculation (the quantization
  comparison's reference precision; a speculative config takes its baseline's);
- for a speculative config, with its baseline (``study.baseline``, else the same engine and
  checkpoint without speculation): greedy speculation must change no output, so every
  differing prompt is a losslessness mismatch, unless the baseline's token where they part
  stood within ``NEAR_TIE_NATS`` of the runner-up: batched verification computes the same
  logits as one-token decoding only up to rounding, which may flip such a near-tie;

and its teacher-forced pass over the held-out text with the reference's on the same tokens
(``divergence.py``): KL divergence, top-1 agreement, perplexity.

Outputs are compared by token ids where both cells have them, else by characters; each
position column names its unit, and positions count from 0. ``rows_from_results`` and the
comparisons are pure; the files are read and written only by ``build_from_plan``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from gridbench.aggregate import dataset
from gridbench.aggregate.analysis import (
    SpeedupPoint,
    cell_index,
    plain_twin,
    precision_references,
    ratio_points,
    rows,
)
from gridbench.aggregate.divergence import DifferentTokens, teacher_forced_divergence
from gridbench.aggregate.records import (
    CellFailure,
    ConfigIdentity,
    EnergyColumns,
    Failure,
    MeasuredCell,
    Provenance,
    missing,
    number,
    optional_float,
    read_cells,
    row_columns,
    typed_document,
)
from gridbench.cells.kinds.quality import QualityCellPlan
from gridbench.cells.plan import QualityPlan
from gridbench.errors import ResultFileError
from gridbench.harness.greedy import SCHEMAS, GreedyOutput, QualityResult

TOKENS = "tokens"
CHARACTERS = "characters"
# a greedy choice this close (nats) to the runner-up may flip on rounding alone: on
# llama.cpp's CPU build a batch computes a token's log-probability up to ~0.015 nats away
# from one-token decoding (tests/test_quality.py measures it), and margins are mostly
# whole nats. (What the engine served before changes the rounding too: a quality cell's
# requests reuse no cached prefix, EngineKind.fresh_prompt_fields, and on llama.cpp the cell
# runs on an engine started for it, EngineKind.answers_depend_on_what_it_served.)
NEAR_TIE_NATS = 0.1


# --- one prompt's two outputs, and a config's against another's ---------------------------


@dataclass(frozen=True)
class Divergence:
    """Two greedy outputs of one prompt, position by position in ``unit``."""

    first_difference: int | None  # the first position where they differ; None: identical
    matched: int  # positions where both hold the same token (or character)
    length: int  # the longer output's

    @property
    def identical(self) -> bool:
        return self.first_difference is None


def divergence(output: Sequence[object], reference: Sequence[object]) -> Divergence:
    """Where two sequences part: the first differing position (the shorter one's length when
    one is a prefix of the other), and how many positions agree."""
    matched = sum(a == b for a, b in zip(output, reference, strict=False))
    first = next((i for i, (a, b) in enumerate(zip(output, reference, strict=False)) if a != b), None)
    if first is None and len(output) != len(reference):
        first = min(len(output), len(reference))
    return Divergence(first, matched, max(len(output), len(reference)))


@dataclass(frozen=True)
class Comparison:
    """A config's outputs against another config's, over the prompts both were sent."""

    unit: str  # TOKENS where every output of both has token ids, else CHARACTERS
    by_class: dict[str, Divergence]  # in the config's prompt order
    # per differing class, the other side's margin over its runner-up where they part
    # (nats; tokens only, and only where that side named its runner-ups)
    margins: dict[str, float | None]

    @property
    def mismatched(self) -> dict[str, int]:
        """Each differing prompt's class and first differing position."""
        return {c: d.first_difference for c, d in self.by_class.items() if d.first_difference is not None}

    @property
    def identical_share(self) -> float | None:
        if not self.by_class:
            return None
        return 1 - len(self.mismatched) / len(self.by_class)

    @property
    def mean_first_difference(self) -> float | None:
        """Over the differing prompts only (an identical one has no such position)."""
        positions = list(self.mismatched.values())
        return sum(positions) / len(positions) if positions else None

    @property
    def match_share(self) -> float | None:
        """Positions holding the same unit in both, of all positions (the longer output's)."""
        length = sum(d.length for d in self.by_class.values())
        if not self.by_class:
            return None
        return sum(d.matched for d in self.by_class.values()) / length if length else 1.0


def compare(outputs: Sequence[GreedyOutput], reference: Sequence[GreedyOutput]) -> Comparison:
    """The prompts both cells answered (same class, same prompt text), compared by token ids
    where all of them have ids, else by the texts' characters."""
    theirs = {o.prompt_class: o for o in reference}
    pairs = [(o, theirs[o.prompt_class]) for o in outputs if o.prompt_class in theirs]
    pairs = [(o, r) for o, r in pairs if o.prompt == r.prompt]
    by_tokens = all(o.token_ids is not None and r.token_ids is not None for o, r in pairs)
    by_class = {o.prompt_class: divergence(*_units(o, r, by_tokens)) for o, r in pairs}
    return Comparison(
        unit=TOKENS if by_tokens else CHARACTERS,
        by_class=by_class,
        margins={
            o.prompt_class: _margin_at(r, by_class[o.prompt_class].first_difference) if by_tokens else None
            for o, r in pairs
            if not by_class[o.prompt_class].identical
        },
    )


def _margin_at(output: GreedyOutput, position: int | None) -> float | None:
    margins = output.runner_up_margins
    if margins is None or position is None or position >= len(margins):
        return None
    return margins[position]


def _units(
    output: GreedyOutput, reference: GreedyOutput, by_tokens: bool
) -> tuple[Sequence[object], Sequence[object]]:
    if by_tokens and output.token_ids is not None and reference.token_ids is not None:
        return output.token_ids, reference.token_ids
    return output.text, reference.text


# --- whom a config is compared with ----------------------------------------------------


def references(plan: QualityPlan) -> dict[str, str]:
    """Each config's reference, where it has one: the declared one, else its reference
    precision (a speculative config: its baseline's)."""
    if plan.settings.reference is not None:
        return dict.fromkeys(plan.configs, plan.settings.reference)
    precision = precision_references([ConfigIdentity.from_config(c) for c in plan.configs.values()])
    speculative = baselines(plan)
    found = {}
    for name in plan.configs:
        plain = name if name in precision else speculative.get(name)
        if plain is not None and plain in precision:
            found[name] = precision[plain]
    return found


def baselines(plan: QualityPlan) -> dict[str, str]:
    """Each speculative config's baseline: the declared one, else the same engine and
    checkpoint without speculation."""
    identities = [ConfigIdentity.from_config(c) for c in plan.configs.values()]
    found = {}
    for identity in identities:
        if identity.speculation_method == "none":
            continue
        baseline = plan.baselines.get(identity.config) or plain_twin(identity, identities)
        if baseline is not None and baseline in plan.configs and baseline != identity.config:
            found[identity.config] = baseline
    return found


# --- the rows ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Outputs:
    """The config's own greedy outputs."""

    prompts: int | None = None
    max_tokens: int | None = None
    outputs_with_token_ids: int | None = None  # the rest are compared by characters


@dataclass(frozen=True)
class Agreement:
    """Greedy agreement with the reference, at temperature 0, over the prompts both answered;
    positions in tokens, or (an output without token ids) in characters."""

    reference: str | None = None
    agreement_unit: str | None = None  # "tokens" or "characters"
    agreement_prompts: int | None = None
    identical_outputs_pct: float | None = None
    first_difference_mean_tokens: float | None = None  # over the differing prompts, from 0
    first_difference_mean_chars: float | None = None
    token_match_pct: float | None = None  # positions holding the same token, of all
    char_match_pct: float | None = None
    agreement_note: str | None = None  # why there are no numbers, when there are none


@dataclass(frozen=True)
class Losslessness:
    """A speculative config's greedy outputs against its baseline's: each differing prompt
    is a mismatch (greedy speculation must change nothing)."""

    baseline: str | None = None
    lossless_prompts: int | None = None
    lossless_mismatches: int | None = None
    lossless_first_difference_tokens: int | None = None  # the earliest of the mismatches, from 0
    lossless_first_difference_chars: int | None = None
    lossless_mismatched_classes: str | None = None  # "code@12, prose@3": class@position
    # the mismatches not explained by a near-tie of the baseline (unknown margins count)
    lossless_mismatches_beyond_ties: int | None = None
    # the largest of the baseline's margins over its runner-up where a mismatch parts
    lossless_divergence_margin_max_nats: float | None = None
    lossless_note: str | None = None


@dataclass(frozen=True)
class TeacherForcedColumns:
    """The teacher-forced pass over the held-out text against the reference's, on the same
    tokens (``aggregate/divergence.py``: KL over the reference's top-K plus a rest bucket,
    in nats per token)."""

    teacher_forced_tokens: int | None = None  # positions compared
    teacher_forced_top_k: int | None = None
    kl_divergence_mean: float | None = None
    kl_divergence_p99: float | None = None
    top1_agreement_pct: float | None = None
    perplexity: float | None = None
    reference_perplexity: float | None = None
    teacher_forced_note: str | None = None  # why there are no numbers, when there are none


@dataclass(frozen=True)
class QualityRow:
    """One row of the quality dataset: a config."""

    config: ConfigIdentity
    status: dataset.Status
    outputs: Outputs | None = None
    agreement: Agreement | None = None
    teacher_forced: TeacherForcedColumns | None = None
    losslessness: Losslessness | None = None
    provenance: Provenance | None = None
    energy: EnergyColumns | None = None
    failure: Failure | None = None
    files: dataset.Files | None = None


COLUMNS = row_columns(QualityRow)
INTEGERS = [
    "num_speculative_tokens",
    "prompts",
    "max_tokens",
    "outputs_with_token_ids",
    "agreement_prompts",
    "teacher_forced_tokens",
    "teacher_forced_top_k",
    "lossless_prompts",
    "lossless_mismatches",
    "lossless_first_difference_tokens",
    "lossless_first_difference_chars",
    "lossless_mismatches_beyond_ties",
    "gpu_count",
    "exit_code",
    *dataset.ENERGY_INTEGERS,
]
FLOATS = [
    "active_weight_gb",
    "identical_outputs_pct",
    "first_difference_mean_tokens",
    "first_difference_mean_chars",
    "token_match_pct",
    "char_match_pct",
    "kl_divergence_mean",
    "kl_divergence_p99",
    "top1_agreement_pct",
    "perplexity",
    "reference_perplexity",
    "lossless_divergence_margin_max_nats",
    *[c for c in dataset.FLOAT_COLUMNS if c in dataset.PROVENANCE],
    *dataset.ENERGY_FLOATS,
]


def agreement(
    name: str, reference: str | None, results: Mapping[str, MeasuredCell[QualityResult]]
) -> Agreement:
    if reference is None:
        return Agreement(agreement_note="no reference: no config serves the same weights without speculation")
    theirs = results.get(reference)
    if theirs is None:
        return Agreement(reference, agreement_note=f"the reference {reference} has no quality result")
    found = compare(results[name].output.outputs, theirs.output.outputs)
    if not found.by_class:
        return Agreement(reference, agreement_note=f"no prompt was sent to both {name} and {reference}")
    by_tokens = found.unit == TOKENS
    mean, match = found.mean_first_difference, _pct(found.match_share)
    return Agreement(
        reference=reference,
        agreement_unit=found.unit,
        agreement_prompts=len(found.by_class),
        identical_outputs_pct=_pct(found.identical_share),
        first_difference_mean_tokens=mean if by_tokens else None,
        first_difference_mean_chars=None if by_tokens else mean,
        token_match_pct=match if by_tokens else None,
        char_match_pct=None if by_tokens else match,
    )


def losslessness(
    name: str, baseline: str, results: Mapping[str, MeasuredCell[QualityResult]]
) -> Losslessness:
    theirs = results.get(baseline)
    if theirs is None:
        return Losslessness(baseline, lossless_note=f"the baseline {baseline} has no quality result")
    found = compare(results[name].output.outputs, theirs.output.outputs)
    mismatched = found.mismatched
    first = min(mismatched.values(), default=None)
    by_tokens = found.unit == TOKENS
    margins = [m for m in found.margins.values() if m is not None]
    at_ties = sum(m is not None and m < NEAR_TIE_NATS for m in found.margins.values())
    return Losslessness(
        baseline=baseline,
        lossless_prompts=len(found.by_class),
        lossless_mismatches=len(mismatched),
        lossless_first_difference_tokens=first if by_tokens else None,
        lossless_first_difference_chars=None if by_tokens else first,
        lossless_mismatched_classes=", ".join(_where(c, p, found.margins[c]) for c, p in mismatched.items())
        or None,
        lossless_mismatches_beyond_ties=len(mismatched) - at_ties,
        lossless_divergence_margin_max_nats=max(margins, default=None),
        lossless_note=None if found.by_class else f"no prompt was sent to both {name} and {baseline}",
    )


def _where(prompt_class: str, position: int, margin: float | None) -> str:
    """class@position, with the baseline's margin there where known ("code@12 (0.004 nats)")."""
    return f"{prompt_class}@{position}" + ("" if margin is None else f" ({margin:.3g} nats)")


def teacher_forced_columns(
    reference: str | None, result: QualityResult, results: Mapping[str, MeasuredCell[QualityResult]]
) -> TeacherForcedColumns | None:
    """None where the config's cell made no teacher-forced pass."""
    own = result.teacher_forced
    if own is None:
        return None
    cell = results.get(reference) if reference is not None else None
    theirs = cell.output.teacher_forced if cell is not None else None
    if theirs is None:
        note = f"no teacher-forced pass of a reference ({reference})"
        return TeacherForcedColumns(teacher_forced_note=note)
    try:
        found = teacher_forced_divergence(own, theirs)
    except DifferentTokens as err:
        note = f"the held-out text's tokens differ from {reference}'s: {err}"
        return TeacherForcedColumns(teacher_forced_note=note)
    return TeacherForcedColumns(
        teacher_forced_tokens=found.tokens,
        teacher_forced_top_k=min(own.top_k, theirs.top_k),
        kl_divergence_mean=found.kl_mean,
        kl_divergence_p99=found.kl_p99,
        top1_agreement_pct=_pct(found.top1_agreement),
        perplexity=found.perplexity,
        reference_perplexity=found.reference_perplexity,
    )


def output_tokens(outputs: Sequence[GreedyOutput]) -> int | None:
    """The tokens the outputs generated (the usage block's count, else the token ids);
    None where one output has neither: a partial count would overstate energy per token."""
    counts = [o.output_tokens if o.output_tokens is not None else _id_count(o) for o in outputs]
    return sum(c for c in counts if c is not None) if counts and None not in counts else None


def _id_count(output: GreedyOutput) -> int | None:
    return len(output.token_ids) if output.token_ids is not None else None


def _pct(share: float | None) -> float | None:
    return None if share is None else round(100 * share, 3)


def rows_from_results(
    plan: QualityPlan,
    results: Mapping[str, MeasuredCell[QualityResult]],
    failures: Mapping[str, CellFailure],
) -> list[QualityRow]:
    chosen, speculative = references(plan), baselines(plan)
    rows = []
    for cell in plan.cells:
        identity = ConfigIdentity.from_config(plan.configs[cell.config])
        result = results.get(cell.config)
        if result is None:
            failure = failures.get(cell.config)
            rows.append(
                QualityRow(
                    identity,
                    dataset.Status("failed", (failure.reason if failure else None) or dataset.NOT_RUN),
                    failure=failure.details if failure else None,
                    files=dataset.Files(
                        failure_path=dataset.failure_path(cell, failure), log_path=cell.files.log
                    ),
                )
            )
            continue
        outputs = result.output.outputs
        baseline = speculative.get(cell.config)
        rows.append(
            QualityRow(
                identity,
                dataset.Status("ok"),
                Outputs(
                    prompts=len(outputs),
                    max_tokens=result.output.max_tokens,
                    outputs_with_token_ids=sum(o.token_ids is not None for o in outputs),
                ),
                agreement(cell.config, chosen.get(cell.config), results),
                teacher_forced_columns(chosen.get(cell.config), result.output, results),
                losslessness(cell.config, baseline, results) if baseline else None,
                result.provenance.provenance,
                EnergyColumns.of(result.provenance.telemetry, output_tokens(outputs), plan.gpu_hour_usd),
                files=dataset.Files(cell.files.raw, cell.files.provenance, log_path=cell.files.log),
            )
        )
    return rows


def to_frame(rows: Sequence[QualityRow]) -> pd.DataFrame:
    return dataset.typed_frame(rows, COLUMNS, integers=INTEGERS, floats=FLOATS)


def parse_result(document: object, cell: QualityCellPlan) -> QualityResult:
    """A quality cell's result; ResultFileError for one that is not this cell's."""
    if not isinstance(document, Mapping) or document.get("schema") not in SCHEMAS:
        raise ResultFileError(f"not a quality result (schema {' or '.join(SCHEMAS)})")
    result = typed_document(QualityResult, document, "not a quality result")
    if result.config != cell.config:
        raise ResultFileError(f"holds config {result.config}'s outputs, expected {cell.config}'s")
    return result


def build_from_plan(plan: QualityPlan, *, csv: Path, parquet: Path) -> pd.DataFrame:
    results, failures = read_cells(plan.cells, lambda cell: cell.config, parse_result)
    frame = to_frame(rows_from_results(plan, results, failures))
    dataset.write_frame(frame, csv=csv, parquet=parquet)
    return frame


# --- speed beside quality ---------------------------------------------------------------


@dataclass(frozen=True)
class SpeedQuality:
    """A config's greedy agreement with its reference beside its decode speed over the
    reference's, at the shallowest depth both measured (None: not both measured)."""

    config: str
    reference: str
    agreement_pct: float  # the share of positions that match, in agreement_unit
    agreement_unit: str
    identical_outputs_pct: float
    speedup: SpeedupPoint | None
    on_frontier: bool = False
    kl_divergence_mean: float | None = None  # the teacher-forced pass's, where it made one
    top1_agreement_pct: float | None = None  # no other config is both faster and closer to the reference


def speed_quality(quality: pd.DataFrame, depth: pd.DataFrame) -> list[SpeedQuality]:
    """Every config with agreement numbers, in the quality dataset's order, its speed-up
    from the depth dataset and whether it is on the speed–quality frontier."""
    cells = cell_index(depth) if not depth.empty else {}
    points = []
    for row in rows(quality):
        unit = str(row["agreement_unit"])
        agreement_pct = row["token_match_pct"] if unit == TOKENS else row["char_match_pct"]
        if row["status"] != "ok" or missing(row["reference"]) or missing(agreement_pct):
            continue
        config, reference = str(row["config"]), str(row["reference"])
        ratios = ratio_points(cells, config, reference, "decode_tps")
        points.append(
            SpeedQuality(
                config,
                reference,
                number(agreement_pct),
                unit,
                number(row["identical_outputs_pct"]),
                ratios[0] if ratios else None,
                kl_divergence_mean=optional_float(row.get("kl_divergence_mean")),
                top1_agreement_pct=optional_float(row.get("top1_agreement_pct")),
            )
        )
    return [replace(p, on_frontier=_undominated(p, points)) for p in points]


def _undominated(point: SpeedQuality, points: Sequence[SpeedQuality]) -> bool:
    if point.speedup is None:
        return False
    speed, agreement = point.speedup.speedup.mean, point.agreement_pct
    for other in points:
        if other.speedup is None or other is point:
            continue
        faster, closer = other.speedup.speedup.mean, other.agreement_pct
        if faster >= speed and closer >= agreement and (faster > speed or closer > agreement):
            return False
    return True
