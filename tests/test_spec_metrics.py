"""Speculative-decoding counters parsed from real Prometheus exposition text."""

from __future__ import annotations

import pytest

from gridbench.engines.spec_metrics import acceptance, parse_spec_counters

VLLM_TWO_ENGINES = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="aeon"} 100.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="aeon"} 50.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="aeon"} 1.7962e+09
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="aeon"} 500.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="aeon"} 250.0
vllm:spec_decode_num_draft_tokens_created{engine="0",model_name="aeon"} 1.7962e+09
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="aeon"} 200.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="aeon"} 100.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="aeon",position="0"} 80.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="aeon",position="1"} 60.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="aeon",position="0"} 40.0
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="aeon",position="0"} 1.7962e+09
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="aeon"} 0.0
"""

LLAMACPP = """\
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 256
# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 120
# HELP llamacpp:spec_decode_num_accepted_tokens_total Speculative: Total draft tokens accepted
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total 90
# HELP llamacpp:spec_decode_num_drafts_total Speculative: Total drafts
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 30
"""


def test_vllm_counters_sum_engines_and_ignore_created_samples():
    counters = parse_spec_counters(VLLM_TWO_ENGINES)
    assert (counters.drafts, counters.draft_tokens, counters.accepted_tokens) == (150, 750, 300)
    assert counters.accepted_per_pos == {0: 120, 1: 60}


def test_acceptance_from_deltas():
    before = parse_spec_counters(VLLM_TWO_ENGINES)
    lines = VLLM_TWO_ENGINES.splitlines()
    bumped = {  # engine 0 only: +10 drafts, +50 draft tokens, +30 accepted (10 + 5 at pos 0, 1)
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="aeon"}': 110,
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="aeon"}': 550,
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="aeon"}': 230,
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="aeon",position="0"}': 90,
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="aeon",position="1"}': 65,
    }
    after_text = (
        "\n".join(
            f"{line.split(' ')[0]} {bumped[line.split(' ')[0]]}" if line.split(" ")[0] in bumped else line
            for line in lines
        )
        + "\n"
    )
    result = acceptance(before, parse_spec_counters(after_text), "test")
    assert result.delta_drafts == 10 and result.delta_draft_tokens == 50
    assert result.acceptance_rate == pytest.approx(30 / 50)
    assert result.mean_acceptance_length == pytest.approx(1 + 30 / 10)
    assert result.acceptance_per_position == pytest.approx((1.0, 0.5))


def test_llamacpp_counters():
    counters = parse_spec_counters(LLAMACPP)
    assert (counters.drafts, counters.draft_tokens, counters.accepted_tokens) == (30, 120, 90)
    assert counters.present


def test_engine_without_speculation_has_no_rates():
    empty = parse_spec_counters(
        "# TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total 5\n"
    )
    result = acceptance(empty, empty, "test")
    assert not result.counters_present
    assert result.acceptance_rate is None and result.mean_acceptance_length is None
