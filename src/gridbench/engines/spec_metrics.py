"""Speculative-decoding counters from Prometheus text, and what follows from their deltas.

vLLM exports ``vllm:spec_decode_num_{drafts,draft_tokens,accepted_tokens}`` and
``..._accepted_tokens_per_pos{position}``; llama.cpp exports the first three under the
``llamacpp:`` prefix. Only ``_total`` samples count (``_created`` are timestamps), summed
over engines and models.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gridbench.engines.kinds import KINDS

PREFIXES = tuple(kind.spec_metrics_prefix for kind in KINDS.values())
_FIELDS = {
    "num_drafts_total": "drafts",
    "num_draft_tokens_total": "draft_tokens",
    "num_accepted_tokens_total": "accepted_tokens",
}
_PER_POS = "num_accepted_tokens_per_pos_total"


@dataclass(frozen=True)
class SpecCounters:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    accepted_per_pos: dict[int, float] = field(default_factory=dict)
    present: bool = False

    def __sub__(self, before: SpecCounters) -> SpecCounters:
        positions = sorted(set(self.accepted_per_pos) | set(before.accepted_per_pos))
        return SpecCounters(
            drafts=self.drafts - before.drafts,
            draft_tokens=self.draft_tokens - before.draft_tokens,
            accepted_tokens=self.accepted_tokens - before.accepted_tokens,
            accepted_per_pos={
                p: self.accepted_per_pos.get(p, 0.0) - before.accepted_per_pos.get(p, 0.0) for p in positions
            },
            present=self.present and before.present,
        )


def parse_spec_counters(text: str) -> SpecCounters:
    from prometheus_client.parser import text_string_to_metric_families

    values = dict.fromkeys(_FIELDS.values(), 0.0)
    per_pos: dict[int, float] = {}
    present = False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            prefix = next((p for p in PREFIXES if sample.name.startswith(p)), None)
            if prefix is None:
                continue
            suffix = sample.name[len(prefix) :]
            if suffix in _FIELDS:
                values[_FIELDS[suffix]] += sample.value
                present = True
            elif suffix == _PER_POS and "position" in sample.labels:
                position = int(sample.labels["position"])
                per_pos[position] = per_pos.get(position, 0.0) + sample.value
    return SpecCounters(**values, accepted_per_pos=per_pos, present=present)


@dataclass(frozen=True)
class Acceptance:
    """The counters' deltas over a measured window and the rates derived from them (None
    when undefined); ``window`` says which requests the window spans. The ``spec_decode``
    record of a provenance and a natural result file."""

    counters_present: bool
    delta_drafts: float
    delta_draft_tokens: float
    delta_accepted_tokens: float
    delta_accepted_per_pos: tuple[float, ...]
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    acceptance_per_position: tuple[float, ...] | None
    window: str


def acceptance(before: SpecCounters, after: SpecCounters, window: str) -> Acceptance:
    """Deltas over the measured window and the rates derived from them (None when undefined)."""
    delta = after - before
    positions = sorted(delta.accepted_per_pos)
    return Acceptance(
        counters_present=delta.present,
        delta_drafts=delta.drafts,
        delta_draft_tokens=delta.draft_tokens,
        delta_accepted_tokens=delta.accepted_tokens,
        delta_accepted_per_pos=tuple(delta.accepted_per_pos[p] for p in positions),
        acceptance_rate=delta.accepted_tokens / delta.draft_tokens if delta.draft_tokens > 0 else None,
        mean_acceptance_length=1 + delta.accepted_tokens / delta.drafts if delta.drafts > 0 else None,
        acceptance_per_position=(
            tuple(delta.accepted_per_pos[p] / delta.drafts for p in positions)
            if delta.drafts > 0 and positions
            else None
        ),
        window=window,
    )
