"""The natural-prompt harness against real servers: llama.cpp, and one that fails on purpose."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, free_port, load_yaml
from gridbench.cells.context import cell_from_grid
from gridbench.cells.run import run_cell
from gridbench.config.grid import Grid
from gridbench.config.loading import load_grid
from gridbench.engines import probe
from gridbench.engines.manager import SlotManager
from gridbench.engines.spec_metrics import parse_spec_counters
from gridbench.harness import natural
from gridbench.harness.stats import RequestRecord, summarize
from gridbench.util import codec

pytestmark = pytest.mark.integration
FAULT_SERVER = Path(__file__).with_name("fault_server.py")


@pytest.fixture
def workdir(workdir):
    """The shared workdir, with every engine the test started stopped, even when it fails."""
    yield workdir
    SlotManager(["cpu"]).stop_all()


def demo_grid(natural_section: dict, **engine_changes) -> Grid:
    config = load_yaml(REPO / "config/mechanism.yaml")
    config["engines"]["llamacpp"].update({"port": free_port(), **engine_changes})
    config["natural"] = natural_section
    return load_grid(config, "mechanism.yaml")


def run_natural_cell(grid: Grid, config: str, prompt_class: str, concurrency: int) -> tuple[int, Path]:
    cell = cell_from_grid(
        grid, "natural", config, ["cpu"], prompt_class=prompt_class, concurrency=concurrency
    )
    out = Path(f"results/natural/{config}/{prompt_class}_c{concurrency}.json")
    outputs = {"raw": out, "provenance": out.with_suffix(".provenance.json")}
    return run_cell(cell, outputs), out


# --- a real llama.cpp engine -------------------------------------------------------------


def test_cell_on_llamacpp_counts_what_the_engine_generated(workdir):
    grid = demo_grid(
        {"prompt_classes": ["code"], "concurrency": [2], "requests": 4, "max_tokens": 16, "warmup": 2}
    )
    cfg = grid.configs["D_f16_n0"]
    manager = SlotManager(["cpu"])
    with manager.lease(cfg) as engine:
        before = probe.fetch_metrics(engine.base_url)
    rc, out = run_natural_cell(grid, "D_f16_n0", "code", 2)
    with manager.lease(cfg) as engine:
        assert engine.reused  # the cell ran on the same warm engine
        after = probe.fetch_metrics(engine.base_url)
    assert rc == 0, Path("results/failures/natural/D_f16_n0/code_c2.json").read_text()

    result = json.loads(out.read_text())
    assert result["schema"] == "gridbench.natural.v1" and result["concurrency"] == 2
    assert result["settings"]["prompt"].startswith("Write a complete Python implementation of quicksort")
    requests = result["requests"]
    assert [r["index"] for r in requests] == list(range(4)) and all(r["status"] == "ok" for r in requests)
    for r in requests:
        # equal when the engine sends all of an answer's text in its last chunk
        assert 0 < r["ttft_ms"] <= r["e2e_ms"] and 1 <= r["output_tokens"] <= 16
        assert r["finish_reason"] in ("length", "stop")
    recomputed = summarize([RequestRecord(**r) for r in requests])
    assert result["summary"] == codec.to_json(recomputed)  # recomputable from the file
    assert result["summary"]["ok"] == 4 and result["spec_decode"] is None

    # the engine's own counter agrees with the usage blocks, warm-ups included
    predicted = "llamacpp:tokens_predicted_total"
    generated = _sample(after, predicted) - _sample(before, predicted)
    measured = sum(r["output_tokens"] for r in requests)
    warmups = json.loads(out.with_suffix(".provenance.json").read_text())["bench"]["warmup"]
    assert [w["status"] for w in warmups] == ["ok", "ok"]
    assert generated == measured + sum(w["output_tokens"] for w in warmups)

    provenance = json.loads(out.with_suffix(".provenance.json").read_text())
    assert provenance["versions"]["load_generator"] == "gridbench-natural"
    assert provenance["engine"]["serve_argv"][:3] == [
        "python3",
        "-m",
        "gridbench.testengines.xllamacpp_server",
    ]
    assert provenance["spec_decode"] is None and provenance["fingerprint"] == cfg.fingerprint()


def test_cell_across_two_harness_processes_writes_the_same_records(workdir):
    """natural.processes = 2 on a real engine: the cell's file has every request once, in
    index order, each one's figures from the engine's own stream; only the provenance says."""
    grid = demo_grid(
        {"prompt_classes": ["code"], "concurrency": [2], "requests": 4, "max_tokens": 8, "warmup": 1}
        | {"processes": 2}
    )
    rc, out = run_natural_cell(grid, "D_f16_n0", "code", 2)
    assert rc == 0, Path("results/failures/natural/D_f16_n0/code_c2.json").read_text()
    result = json.loads(out.read_text())
    requests = result["requests"]
    assert [r["index"] for r in requests] == list(range(4)) and all(r["status"] == "ok" for r in requests)
    assert all(0 < r["ttft_ms"] <= r["e2e_ms"] and 1 <= r["output_tokens"] <= 8 for r in requests)
    assert result["summary"] == codec.to_json(summarize([RequestRecord(**r) for r in requests]))
    assert "processes" not in result["settings"]
    provenance = json.loads(out.with_suffix(".provenance.json").read_text())
    assert provenance["bench"]["harness_processes"] == 2


def _sample(text: str, name: str) -> float:
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def test_acceptance_with_a_draft_model_and_none_without(workdir):
    grid = demo_grid(
        {"prompt_classes": ["prose"], "concurrency": [1], "requests": 3, "max_tokens": 24, "warmup": 1}
    )
    rc, out = run_natural_cell(grid, "D_f16_draft4", "prose", 1)
    assert rc == 0
    spec_decode = json.loads(out.read_text())["spec_decode"]
    # the 1-layer draft shares the target's embedding and output matrix: it is almost always right
    assert spec_decode["counters_present"] and spec_decode["acceptance_rate"] > 0.9
    assert spec_decode["delta_draft_tokens"] > 0 and spec_decode["window"].startswith("the measured requests")
    assert 4 < spec_decode["mean_acceptance_length"] <= 5  # n_max 4 drafted, + the bonus token
    assert len(spec_decode["acceptance_per_position"]) == 4  # llama.cpp's per-position counters
    per_position = spec_decode["acceptance_per_position"]
    # a draft near max_tokens is shorter than 4, so later positions count fewer acceptances
    assert per_position[0] > 0.9 and per_position == sorted(per_position, reverse=True)
    provenance = json.loads(out.with_suffix(".provenance.json").read_text())
    assert provenance["spec_decode"] == spec_decode

    rc, out = run_natural_cell(grid, "D_f16_n0", "prose", 1)
    assert rc == 0 and json.loads(out.read_text())["spec_decode"] is None


def test_llamacpp_exposition_text_with_per_position_counters(workdir):
    """The real /metrics of this llama.cpp build, after one speculative request."""
    grid = demo_grid({"prompt_classes": ["code"], "warmup": 1, "max_tokens": 16})
    manager = SlotManager(["cpu"])
    with manager.lease(grid.configs["D_f16_draft4"]) as engine:
        plan = natural.level_plan(grid.natural, "Hello", 1)
        endpoint = natural.Endpoint(engine.base_url, "demo-f16")
        before = parse_spec_counters(probe.fetch_metrics(engine.base_url))
        (trace,) = natural.warm_up(endpoint, plan)
        text = probe.fetch_metrics(engine.base_url)
    assert "llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position=" in text
    counters = parse_spec_counters(text)
    delta = counters - before
    assert counters.present and sorted(counters.accepted_per_pos) == [0, 1, 2, 3]
    assert delta.drafts > 0 and delta.accepted_tokens <= delta.draft_tokens
    assert delta.accepted_per_pos[0] >= delta.accepted_per_pos[3]  # non-increasing over positions
    assert trace.status == "ok"


# --- a server that fails on purpose -----------------------------------------------------


@pytest.fixture
def fault_server(request):
    """Start tests/fault_server.py with FAULTS from the test's parameter; yield its endpoint."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(FAULT_SERVER), "--port", str(port)],
        env={"FAULTS": request.param, "PATH": ""},
    )
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while probe.http_get(base_url + "/health")[0] != 200:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    yield natural.Endpoint(base_url, "fault")
    proc.terminate()
    proc.wait(timeout=10)


FAULTS = "1:500,2:429,4:drop,5:error,6:llamacpp-error,7:nodone,8:nousage,9:hang"


@pytest.mark.parametrize("fault_server", [FAULTS], indirect=True)
def test_every_failure_is_recorded_never_dropped(fault_server, tmp_path):
    plan = natural.LevelPlan(
        prompt="Hi",
        concurrency=4,
        requests=11,
        warmup=0,
        max_tokens=8,
        temperature=0,
        cache_bust=True,
        extra_body={},
        request_timeout_s=2,
    )
    started = time.monotonic()
    traces = natural.measure_level(fault_server, plan, tmp_path / "progress.jsonl")
    assert time.monotonic() - started < 10  # the hung request timed out; the others went on
    result = codec.to_json(
        natural.level_result(config="F", prompt_class="x", plan=plan, traces=traces, spec_decode=None)
    )
    by_index = {r["index"]: r for r in result["requests"]}
    assert len(by_index) == 11
    expected = {
        0: ("ok", None),
        1: ("errored", "HTTP 500: "),
        2: ("errored", "HTTP 429: "),
        3: ("ok", None),
        4: ("incomplete", "stream broke: "),
        5: ("errored", "error in stream: CUDA error: illegal memory access"),
        6: ("errored", "error in stream: 500: slot unavailable"),
        7: ("incomplete", "stream ended without [DONE]"),
        8: ("incomplete", "stream had no usage block"),
        9: ("errored", "no complete response within 2 s"),
        10: ("ok", None),
    }
    for index, (status, error) in expected.items():
        record = by_index[index]
        assert record["status"] == status, record
        assert (record["error"] is None) if error is None else record["error"].startswith(error), record
    assert "engine core died" in by_index[1]["error"]
    assert by_index[0]["output_tokens"] == 8 and len(by_index[0]["itl_ms"]) == 7
    summary = result["summary"]
    assert (summary["ok"], summary["errored"], summary["incomplete"]) == (3, 5, 3)
    assert summary["error_rate"] == pytest.approx(8 / 11)
    assert summary["output_tok_s"] == pytest.approx(24 / summary["wall_s"], rel=1e-3)
    assert summary["wall_s"] >= 2  # the timed-out request ends the level
    # a line per finished request as it finished, for `gridbench progress`: the hung one last
    lines = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert [line["done"] for line in lines] == list(range(1, 12)) and lines[-1]["status"] == "errored"
    assert sorted(line["status"] for line in lines) == sorted(r["status"] for r in result["requests"])
    assert lines[-1]["output_tokens"] == 24 and lines[-1]["elapsed_s"] >= 2


def fault_grid(faults: str) -> Grid:
    return demo_grid(
        {"prompt_classes": ["code"], "concurrency": [4], "requests": 16, "max_tokens": 8, "warmup": 1},
        command=[sys.executable, str(FAULT_SERVER)],
        env={"FAULTS": faults},
    )


def test_error_rate_above_the_threshold_fails_the_cell(workdir):
    grid = fault_grid("1:500,3:drop")  # 2 of the 16 measured requests (#0 is the warm-up): 12.5 %
    rc, out = run_natural_cell(grid, "D_f16_n0", "code", 4)
    assert rc != 0 and not out.exists()
    failure = json.loads(Path("results/failures/natural/D_f16_n0/code_c4.json").read_text())
    assert "1 errored and 1 incomplete of 16 requests" in failure["reason"]
    assert "> natural.max_error_rate 0.1" in failure["reason"]
    assert failure["cell_log"] == "logs/cells/D_f16_n0/natural_code_c4.log"
    kept = json.loads(Path("results/failures/natural/D_f16_n0/code_c4/natural.json").read_text())
    assert [r["status"] for r in kept["requests"]].count("ok") == 14


def test_error_rate_within_the_threshold_keeps_the_failed_request(workdir):
    grid = fault_grid("4:500")  # the 4th measured request (#0 is the warm-up), 1 of 16: 6 %
    rc, out = run_natural_cell(grid, "D_f16_n0", "code", 4)
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["summary"]["errored"] == 1 and result["summary"]["ok"] == 15
    assert result["requests"][3]["status"] == "errored" and "HTTP 500" in result["requests"][3]["error"]
    assert result["summary"]["output_tokens_p50"] == 8


def test_unknown_prompt_class_is_a_config_error():
    from gridbench.cells.plan import natural_plan
    from gridbench.errors import ConfigError

    with pytest.raises(
        ConfigError, match="unknown class poetry; allowed values: code, reasoning, dialogue, prose"
    ):
        natural_plan(demo_grid({"prompt_classes": ["code", "poetry"]}))


def test_prompt_file_replaces_the_packaged_prompts(tmp_path):
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"haiku": "Write a haiku."}))
    grid = demo_grid({"prompt_classes": ["haiku"], "prompt_file": str(prompts)})
    cell = cell_from_grid(grid, "natural", "D_f16_n0", ["cpu"], prompt_class="haiku", concurrency=1)
    assert cell.prompt == "Write a haiku."
