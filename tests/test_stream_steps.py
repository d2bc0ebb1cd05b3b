"""The counters' accepted tokens beside the stream's (gridbench.aggregate.stream_steps): what a
natural cell's stream counts, which cells are checked, the bound, and the committed H200 study,
whose every speculative vLLM cell agrees."""

from __future__ import annotations

import pandas as pd
import pytest

from conftest import REPO
from gridbench.aggregate.natural import Stream
from gridbench.aggregate.report.spec_log import stream_section
from gridbench.aggregate.stream_steps import stream_checks
from gridbench.harness.stats import RequestRecord


def request(status: str, tokens: int | None, chunks: int) -> RequestRecord:
    itl = tuple(1.0 for _ in range(max(chunks - 1, 0)))
    return RequestRecord(
        index=0, status=status, error=None, start_s=0, end_s=1, output_tokens=tokens, itl_ms=itl
    )


def test_the_stream_counts_tokens_and_chunks_after_each_requests_first():
    # 10 tokens in 4 chunks: the prefill's token, then 9 in 3 steps (6 drafted tokens accepted)
    stream = Stream.of([request("ok", 10, 4), request("ok", 5, 5), request("error", None, 0)])
    assert (stream.stream_tokens, stream.stream_steps) == (9 + 4, 3 + 4)
    assert Stream.of([request("error", None, 0)]) == Stream()


def cell(config: str, kind: str, accepted: int, tokens: int, steps: int, k: int = 4, ok: int = 2) -> dict:
    return {
        "config": config,
        "engine_kind": kind,
        "prompt_class": "code",
        "concurrency": 1,
        "status": "ok",
        "ok": ok,
        "num_speculative_tokens": k,
        "spec_accepted_tokens": accepted,
        "stream_tokens": tokens,
        "stream_steps": steps,
    }


def test_a_cell_agrees_within_k_tokens_a_request_and_only_where_chunks_are_steps():
    natural = pd.DataFrame(
        [
            cell("V_near", "vllm", accepted=108, tokens=300, steps=200),  # 100 streamed: 8 apart, k x 2
            cell("V_far", "vllm", accepted=109, tokens=300, steps=200),  # 9 apart: the window saw more
            cell("L_draft", "llamacpp", accepted=100, tokens=300, steps=300),  # a token a chunk
        ]
    )
    checks = {c.config: c for c in stream_checks(natural)}
    assert set(checks) == {"V_near", "V_far"}
    assert (checks["V_near"].stream, checks["V_near"].bound, checks["V_near"].agrees) == (100, 8, True)
    assert (checks["V_far"].difference, checks["V_far"].agrees) == (9, False)
    section = stream_section(natural)
    assert "in 1 of 2 speculative natural cells it agrees" in section
    assert "| `V_far` | 1 | 109 | 100 | +9 of ±8 (code c=1) | 0 of 1 |" in section
    assert stream_section(natural[natural["engine_kind"] == "llamacpp"]) == ""


@pytest.mark.parametrize(("study", "cells"), [("h200-speculation", 24), ("h100-speculation", 72)])
def test_a_speculation_studys_stream_agrees_with_vllms_counters_in_every_speculative_cell(study, cells):
    natural = pd.read_csv(REPO / f"studies/{study}/dataset/natural.csv")
    checks = stream_checks(natural)
    assert len(checks) == cells and all(c.agrees for c in checks), [c for c in checks if not c.agrees]
    trained = [c for c in checks if c.config == "R_e3_k4"]
    assert sum(c.stream for c in trained) > 18000  # the trained head's drafts, seen by the client too
