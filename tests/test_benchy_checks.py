"""A llama-benchy result counts only when every request of every run is in it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import synthetic
from gridbench.config.grid import BenchySettings
from gridbench.errors import BenchmarkError
from gridbench.harness.benchy import (
    BenchyResult,
    BenchyRun,
    BurstError,
    RequestEnd,
    TransportError,
    check_result,
    read_progress,
    run,
)
from gridbench.util import codec

FIXTURES = Path(__file__).parent / "fixtures"


def settings(**changes) -> BenchySettings:
    base = dict(
        pp=256,
        tg=64,
        exact_tg=False,
        runs=2,
        concurrency=1,
        latency_mode="none",
        warmup=True,
        skip_coherence=True,
        extra_body={},
        corpus="book.txt",
        timeout_s=60,
        transport_retries=1,
    )
    return BenchySettings(**{**base, **changes})


def single_depth(result: dict, depth: int, prompt: int) -> dict:
    return {
        **result,
        "benchmarks": [
            b for b in result["benchmarks"] if b["context_size"] == depth and b["prompt_size"] == prompt
        ],
    }


def test_a_complete_result_passes():
    result = single_depth(json.loads((FIXTURES / "basic_depth0_4096.json").read_text()), 4096, 512)
    entry = check_result(
        BenchyResult.from_json(result), [], depth=4096, settings=settings(runs=3), what="cell"
    )
    assert entry.tg_throughput.mean > 0


def test_failed_requests_fail_the_cell_with_the_server_error():
    result = single_depth(json.loads((FIXTURES / "http500_every3rd.json").read_text()), 0, 256)
    progress = read_progress(FIXTURES / "http500_every3rd.progress.jsonl")
    with pytest.raises(BenchmarkError, match="requests failed, first: HTTP 500") as info:
        check_result(BenchyResult.from_json(result), progress, depth=0, settings=settings(), what="cell")
    assert not isinstance(info.value, TransportError)


def test_missing_values_fail_even_without_progress_events():
    result = single_depth(json.loads((FIXTURES / "http500_every3rd.json").read_text()), 0, 256)
    with pytest.raises(BenchmarkError, match="ttfr has 1 values, expected 2"):
        check_result(BenchyResult.from_json(result), [], depth=0, settings=settings(), what="cell")


def test_null_metrics_fail_the_cell():
    result = single_depth(json.loads((FIXTURES / "basic_depth0_4096.json").read_text()), 0, 512)
    result["benchmarks"][0]["tg_throughput"] = None
    with pytest.raises(BenchmarkError, match="could not measure tg_throughput"):
        check_result(BenchyResult.from_json(result), [], depth=0, settings=settings(runs=3), what="cell")


def test_exact_tg_rejects_a_short_generation():
    result = single_depth(json.loads((FIXTURES / "basic_depth0_4096.json").read_text()), 0, 512)
    progress = read_progress(FIXTURES / "early_eos_progress.jsonl") * 3
    with pytest.raises(
        BenchmarkError, match="exact-tg asked for 64 tokens per request, got \\[10, 10, 10\\]"
    ):
        check_result(
            BenchyResult.from_json(result),
            progress,
            depth=0,
            settings=settings(runs=3, exact_tg=True),
            what="cell",
        )


def test_connection_level_failures_are_transport_errors():
    result = single_depth(json.loads((FIXTURES / "basic_depth0_4096.json").read_text()), 0, 512)
    progress = [RequestEnd(error="Server disconnected", total_tokens=0)]
    with pytest.raises(TransportError):
        check_result(
            BenchyResult.from_json(result), progress, depth=0, settings=settings(runs=3), what="cell"
        )


def test_an_answer_read_in_one_burst_is_worth_another_attempt():
    """Seen on a loaded two-core machine: every request ended without an error, but one
    answer's chunks were all read at once (64 tokens in 1.4 ms), so llama-benchy kept no
    decode speed for it. That attempt is re-measured, not the engine blamed."""
    result = single_depth(json.loads((FIXTURES / "basic_depth0_4096.json").read_text()), 0, 512)
    for metric in ("tg_req_throughput", "tg_throughput"):
        result["benchmarks"][0][metric]["values"] = result["benchmarks"][0][metric]["values"][:2]
    ok = [RequestEnd(error="", total_tokens=64)] * 3
    with pytest.raises(BurstError, match=r"tg_req_throughput has 2 values, expected 3.*one burst"):
        check_result(BenchyResult.from_json(result), ok, depth=0, settings=settings(runs=3), what="cell")
    with pytest.raises(BenchmarkError, match="requests failed") as unknown:  # no sign every request ended
        check_result(BenchyResult.from_json(result), ok[:1], depth=0, settings=settings(runs=3), what="cell")
    assert not isinstance(unknown.value, BurstError)
    result["benchmarks"][0]["tg_throughput"] = None  # every answer in one burst
    with pytest.raises(BurstError, match="could not measure tg_throughput"):
        check_result(BenchyResult.from_json(result), ok, depth=0, settings=settings(runs=3), what="cell")


def test_the_cell_depth_must_be_in_the_result():
    result = json.loads((FIXTURES / "basic_depth0_4096.json").read_text())
    with pytest.raises(BenchmarkError, match="0 results for depth 8192"):
        check_result(BenchyResult.from_json(result), [], depth=8192, settings=settings(runs=3), what="cell")


def test_a_failed_llama_benchy_says_why_in_the_reason(tmp_path, capfd):
    """Found by the chaos soak: the reason said only "exited with code 1", the cause (an
    HTTP 500 in the warm-up) stood in the cell log alone."""
    script = (
        "print('Warming up...'); print('Warmup failed: HTTP 500: injected', flush=True); raise SystemExit(1)"
    )
    failing = BenchyRun((sys.executable, "-c", script), {}, tmp_path / "r.json", tmp_path / "p.jsonl")
    with pytest.raises(BenchmarkError) as caught:
        run(failing, timeout_s=30, what="cell X")
    assert caught.value.message == (
        "cell X: llama-benchy exited with code 1; its last line: Warmup failed: HTTP 500: injected"
    )
    assert "Warming up...\nWarmup failed" in capfd.readouterr().out  # the cell log keeps it all

    killed = BenchyRun((sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"), {}, tmp_path, tmp_path)
    with pytest.raises(BenchmarkError) as caught:
        run(killed, timeout_s=30, what="cell X")
    assert caught.value.message == "cell X: llama-benchy was killed by SIGKILL"


def test_a_request_that_failed_is_the_reason_though_metrics_are_null_too():
    """Found by the chaos soak: the only request of a run got an HTTP 500 (or its stream was
    cut), llama-benchy left tg_throughput null, and the reason said "could not measure
    tg_throughput (null)" instead of the request's error."""
    result = single_depth(json.loads((FIXTURES / "basic_depth0_4096.json").read_text()), 0, 512)
    result["benchmarks"][0]["tg_throughput"] = None
    failed = [RequestEnd(error="HTTP 500: injected", total_tokens=0)]
    with pytest.raises(BenchmarkError, match="1 requests failed, first: HTTP 500: injected") as info:
        check_result(BenchyResult.from_json(result), failed, depth=0, settings=settings(runs=1), what="cell")
    assert not isinstance(info.value, TransportError)


# --- the prefix-cache pass: llama-benchy's --enable-prefix-caching --------------------------


def cached_result(**measured_changes) -> dict:
    result = codec.to_json(
        synthetic.cached_benchy_raw(
            1024, load_ttft_ms=(90.0, 1.0), ttft_ms=(20.0, 1.0), prefill=(6000.0, 60.0), pp=128, tg=64
        )
    )
    result["benchmarks"][1].update(measured_changes)
    return result


# a context load, then the measured request, per run: twice the requests of a cold cell
BOTH_PHASES = [RequestEnd(error="", total_tokens=64)] * 4


def test_a_cached_result_needs_only_its_time_to_first_token():
    """llama-benchy leaves prefill null when a cached answer came within its latency, and a
    cached answer may arrive in one burst: the cached cell measures TTFT, the cold one decode."""
    result = cached_result(pp_throughput=None, tg_throughput=None, tg_req_throughput=None)
    entry = check_result(
        BenchyResult.from_json(result),
        BOTH_PHASES,
        depth=1024,
        settings=settings(exact_tg=True),
        what="cell",
        prefix_cache=True,
    )
    assert entry.e2e_ttft.mean == 20.0 and not entry.is_context_prefill_phase
    with pytest.raises(BenchmarkError, match="could not measure e2e_ttft"):
        check_result(
            BenchyResult.from_json(cached_result(e2e_ttft=None)),
            BOTH_PHASES,
            depth=1024,
            settings=settings(),
            what="c",
            prefix_cache=True,
        )


def test_a_cached_result_without_its_context_load_is_a_cold_measurement_and_fails():
    result = cached_result()
    result["benchmarks"] = result["benchmarks"][1:]
    with pytest.raises(BenchmarkError, match="0 context-load phases for depth 1024"):
        check_result(
            BenchyResult.from_json(result),
            BOTH_PHASES,
            depth=1024,
            settings=settings(),
            what="cell",
            prefix_cache=True,
        )


def test_a_failed_context_load_fails_the_cached_cell():
    progress = [*BOTH_PHASES[:3], RequestEnd(error="HTTP 500: load", total_tokens=0)]
    with pytest.raises(BenchmarkError, match="1 requests failed, first: HTTP 500: load"):
        check_result(
            BenchyResult.from_json(cached_result()),
            progress,
            depth=1024,
            settings=settings(),
            what="cell",
            prefix_cache=True,
        )


def test_exact_tg_counts_the_requests_of_both_phases():
    with pytest.raises(BenchmarkError, match="fewer requests than runs"):
        check_result(
            BenchyResult.from_json(cached_result()),
            BOTH_PHASES[:2],
            depth=1024,
            settings=settings(exact_tg=True),
            what="c",
            prefix_cache=True,
        )
