"""How gridbench reads a server's answer to a prefix-cache reset (pure)."""

from __future__ import annotations

import pytest

from gridbench.engines.kinds.vllm import prefix_cache_was_reset


@pytest.mark.parametrize(
    ("status", "body", "reset"),
    [
        (200, '{"success":true}', True),  # vLLM 0.32
        (200, '{"success":false}', False),  # vLLM 0.32 while blocks are still held
        (200, "", True),  # older vLLM: an empty 200
        (404, '{"detail":"Not Found"}', False),  # no VLLM_SERVER_DEV_MODE
        (0, "", False),  # nothing answered
    ],
)
def test_prefix_cache_reset_answers(status, body, reset):
    assert prefix_cache_was_reset(status, body) is reset
