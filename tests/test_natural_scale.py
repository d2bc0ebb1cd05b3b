"""The natural-prompt harness across processes, against the paced server's truth
(benchmarks/paced_server.py): one level's requests split over worker processes come back
as the records a single loop writes, on one clock, under one concurrency limit."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys

import pytest

from conftest import REPO, load_yaml
from gridbench.cells.context import write_context
from gridbench.config.loading import load_grid
from gridbench.harness import natural
from gridbench.harness.prompts import NaturalSettings
from gridbench.harness.stats import OK, nearest_rank
from gridbench.util import codec

# a token every 10 ms: at 5 ms the 32 streams' 6400 events/s left the harness behind on the
# CI's loaded 2 cores (p50 TPOT 3.8 % over the truth, beside the demo sweep; beside four busy
# loops 4 of 6 runs failed, at 10 ms 1 of 10)
CONCURRENCY, REQUESTS, TOKENS, TTFT_MS, GAP_MS = 32, 96, 64, 50, 10
WARMUP = 3  # measured requests are numbered after the warm-ups


@pytest.fixture
def paced(monkeypatch):
    spec = importlib.util.spec_from_file_location("paced_server", REPO / "benchmarks/paced_server.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    with module.PacedServer(TTFT_MS, GAP_MS, TOKENS, processes=1) as server:
        yield server


def plan(processes: int) -> natural.LevelPlan:
    return natural.LevelPlan(
        prompt="Write a story.",
        concurrency=CONCURRENCY,
        requests=REQUESTS,
        warmup=WARMUP,
        max_tokens=TOKENS,
        temperature=0,
        cache_bust=True,
        extra_body={},
        request_timeout_s=60,
        processes=processes,
    )


def most_in_flight(traces) -> int:
    """The most requests in flight at once, from the traces' own start and end."""
    events = sorted([(t.start_ns, 1) for t in traces] + [(t.end_ns, -1) for t in traces])
    in_flight = most = 0
    for _, step in events:
        in_flight += step
        most = max(most, in_flight)
    return most


def test_a_level_across_processes_is_the_single_loops_level(paced, tmp_path):
    level = plan(processes=2)
    progress = tmp_path / "progress.jsonl"
    traces = natural.measure_level(natural.Endpoint(paced.base_url, "paced"), level, progress)
    server_log = paced.take_log()

    # merged exactly: every request once, in index order, none lost, none twice
    indices = [t.index for t in traces]
    assert indices == list(range(WARMUP, WARMUP + REQUESTS))
    assert all(t.status == OK and t.output_tokens == TOKENS for t in traces)
    served = sorted(int(re.match(r"\[bench-(\d+)\]", e["prompt"]).group(1)) for e in server_log)
    assert served == indices
    assert len(progress.read_text().splitlines()) == REQUESTS  # the parent saw each as it ended
    # one limit across the processes: all of it used, never exceeded
    assert most_in_flight(traces) == CONCURRENCY

    # one clock: each request reached the server after the harness sent it, and each token
    # reached the harness after the server wrote it, within a loaded machine's delays
    by_index = {int(re.match(r"\[bench-(\d+)\]", e["prompt"]).group(1)): e for e in server_log}
    for t in traces:
        truth = by_index[t.index]
        assert 0 <= truth["arrival"] - t.start_ns < 50e6
        assert 0 <= t.text_chunk_ns[0] - truth["first"] < 50e6
        assert 0 <= t.text_chunk_ns[-1] - truth["last"] < 50e6

    # the records a level writes, and their figures close to the server's
    document = codec.to_json(
        natural.level_result(config="paced", prompt_class="x", plan=level, traces=traces, spec_decode=None)
    )
    records = document["requests"]
    assert [r["index"] for r in records] == list(range(REQUESTS))
    summary = document["summary"]
    true_ttft = nearest_rank(sorted((e["first"] - e["arrival"]) / 1e6 for e in server_log), 50)
    true_tpot = nearest_rank(
        sorted((e["last"] - e["first"]) / 1e6 / (e["tokens"] - 1) for e in server_log), 50
    )
    # generous bounds for a 2-core machine shared with other work; a clock or merge error
    # is off by far more (a whole request, or the clocks' offset)
    assert summary["ttft_ms_p50"] == pytest.approx(true_ttft, rel=0.10)
    assert summary["tpot_ms_p50"] == pytest.approx(true_tpot, rel=0.03)


def test_a_dead_worker_fails_the_level_instead_of_hanging(monkeypatch):
    """A worker that dies takes its requests with it: the level must not wait for them."""
    level = plan(processes=2)
    endpoint = natural.Endpoint("http://127.0.0.1:9", "paced")  # never reached
    monkeypatch.setattr(natural, "_worker", _exit_at_once)
    with pytest.raises(RuntimeError, match="died mid-level"):
        natural.run_across_processes(endpoint, level, lambda _trace: None)


def _exit_at_once(*_args) -> None:
    sys.exit(3)


@pytest.mark.parametrize(
    ("setting", "concurrency", "cpus", "processes"),
    [
        ("auto", 1, 16, 1),
        ("auto", 64, 16, 1),
        ("auto", 65, 16, 2),
        ("auto", 1024, 16, 16),
        ("auto", 1024, 2, 2),
        ("auto", 256, None, 1),
        (4, 256, 2, 4),  # asked for: as many as asked
        (8, 3, 16, 3),  # but never more than requests in flight
    ],
)
def test_processes_per_level(setting, concurrency, cpus, processes):
    assert natural.harness_processes(setting, concurrency, cpus) == processes


def test_slots_split_the_concurrency_evenly():
    assert natural.process_slots(10, 3) == [4, 3, 3]
    assert sum(natural.process_slots(1024, 16)) == 1024


@pytest.mark.parametrize(("processes", "in_context"), [("auto", False), (4, True)])
def test_the_default_processes_leave_a_cells_context_as_it_was(processes, in_context, tmp_path, monkeypatch):
    """A cell's context names its params: the default must not rerun the cells of studies
    measured before natural.processes existed; a value asked for travels to the cell."""
    config = load_yaml(REPO / "config/mechanism.yaml")
    config["natural"] = {"concurrency": [128], "processes": processes}
    grid = load_grid(config, "mechanism.yaml")
    monkeypatch.chdir(tmp_path)
    context = json.loads(write_context(grid, next(iter(grid.configs)), ["cpu"], "natural").read_text())
    assert ("processes" in context["natural"]) is in_context
    settings = codec.from_json(NaturalSettings, context["natural"])
    plan = natural.level_plan(settings, "Hello", 128)
    assert plan.processes == (natural.harness_processes("auto", 128, os.cpu_count()) if not in_context else 4)
