"""The counters' accepted tokens beside the client's own count of them, cell by cell (pure).
Where an engine streams each step's tokens as one chunk (vLLM), every step after the prefill
sends one chunk holding its target token and the drafted tokens it accepted: a natural cell's
output tokens after the first, less its text chunks after the first, are the drafted tokens
its steps accepted, whatever the method (one that skips drafting, as n-gram, sends one token
for such a step). The two part only at each request's last step: the counters also count
drafted tokens accepted past the EOS or max_tokens that ends it, and the EOS token itself
streams no text; so a cell agrees where they differ by at most k tokens a request."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from gridbench.engines.kinds import engine_kind


@dataclass(frozen=True)
class StreamCheck:
    config: str
    prompt_class: str
    concurrency: int
    counters: int  # accepted tokens, from the engine's counters over the cell's window
    stream: int  # accepted tokens, from the stream: tokens less chunks after each first
    bound: int  # k drafted tokens for each ok request

    @property
    def difference(self) -> int:
        return self.counters - self.stream

    @property
    def agrees(self) -> bool:
        return abs(self.difference) <= self.bound


def stream_checks(natural: pd.DataFrame | None) -> list[StreamCheck]:
    """One check per measured speculative natural cell of an engine whose chunks are steps."""
    if natural is None or "stream_steps" not in natural.columns:
        return []
    rows = natural[
        (natural["status"] == "ok")
        & natural["spec_accepted_tokens"].notna()
        & natural["stream_steps"].notna()
        & natural["num_speculative_tokens"].notna()
    ]
    return [
        StreamCheck(
            str(row.config),
            str(row.prompt_class),
            int(row.concurrency),
            int(row.spec_accepted_tokens),
            int(row.stream_tokens) - int(row.stream_steps),
            int(row.num_speculative_tokens) * int(row.ok),
        )
        for row in rows.itertuples()
        if engine_kind(str(row.engine_kind)).streams_a_step_per_chunk
    ]
