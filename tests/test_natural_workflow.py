"""Natural-prompt cells in the workflow: beside llama-benchy cells on one warm engine, and
seed study 000's config planned end to end (dry-run)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, load_yaml, write_config
from gridbench.cells.plan import depth_plan, natural_plan
from gridbench.config.loading import load_grid
from gridbench.errors import ConfigError
from test_workflow import events, snakemake

STUDY = REPO / "config/studies/qwen36-35b-a3b-dflash.yaml"


@pytest.mark.workflow
def test_benchy_and_natural_cells_share_one_engine_start_per_config(workdir, demo_config):
    demo_config["configs"] = {k: demo_config["configs"][k] for k in ("D_f16_n0", "D_f16_draft4")}
    demo_config["depths"] = [512]  # a long prompt: llama-benchy's pp estimate survives a loaded CPU better
    demo_config["natural"] = {
        "prompt_classes": ["code"],
        "concurrency": [1, 2],
        "requests": 2,
        "max_tokens": 8,
        "warmup": 1,
    }
    write_config(workdir / "grid.yaml", demo_config)
    result = snakemake(workdir, "--configfile", "grid.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    starts = [e["config"] for e in events(workdir) if e["event"] == "start"]
    assert starts == ["D_f16_n0", "D_f16_draft4"]  # 3 cells each, one engine start each
    for config in ("D_f16_n0", "D_f16_draft4"):
        for c in (1, 2):
            raw = json.loads((workdir / f"results/natural/{config}/code_c{c}.json").read_text())
            assert raw["summary"]["ok"] == 2 and raw["concurrency"] == c
            assert (workdir / f"results/natural/{config}/code_c{c}.provenance.json").exists()
            assert (workdir / f"logs/cells/{config}/natural_code_c{c}.log").exists()
            assert (raw["spec_decode"] is None) == (config == "D_f16_n0")
    assert (workdir / "dataset/dataset.csv").exists()


def dry_run_counts(workdir: Path, *args: str) -> dict[str, int]:
    exe = Path(sys.executable).parent / "snakemake"
    result = subprocess.run(
        [str(exe), "-n", "--quiet", "rules", "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    counts = {}
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            counts[parts[0]] = int(parts[1])
    return counts


def test_seed_000_study_dry_runs_as_48_natural_cells(tmp_path):
    counts = dry_run_counts(tmp_path, "--configfile", str(STUDY))
    assert counts["natural_cell"] == 3 * 4 * 4
    assert "bench_cell" not in counts  # no llama-benchy sweep: the depth dataset is empty


def test_seed_000_study_is_the_seed_setup():
    from gridbench.config.loading import load_grid_files
    from gridbench.engines.describe import describe_launch

    grid = load_grid_files([STUDY])
    assert grid.depths == ()
    assert grid.natural.prompt_classes == ("code", "reasoning", "dialogue", "prose")
    assert grid.natural.concurrency == (1, 4, 8, 16)
    assert (grid.natural.requests, grid.natural.max_tokens, grid.natural.warmup) == (16, 512, 3)
    assert grid.natural.extra_body == {"chat_template_kwargs": {"enable_thinking": False}}
    dfl5 = describe_launch(grid.configs["A_nvfp4_dfl5"])
    for flags in (
        "--gpus all",
        "--network host",
        "--ipc host",
        "--ulimit memlock=-1",
        "ghcr.io/aeon-7/vllm-spark-omni-q36:v1.2 AEON-7/Qwen3.6-35B-A3B-heretic-NVFP4",
        "--speculative-model z-lab/Qwen3.6-35B-A3B-DFlash --num-speculative-tokens 5",
        "--moe-backend marlin",
        "--max-model-len 262144",
        "--gpu-memory-utilization 0.85",
        "--enable-prefix-caching",
    ):
        assert flags in dfl5, flags
    assert "--num-speculative-tokens 15" in describe_launch(grid.configs["A_nvfp4_dfl15"])
    mtp = describe_launch(grid.configs["B_fp8_mtp1"])
    assert "Qwen/Qwen3.6-35B-A3B-FP8" in mtp and '{"method":"mtp","num_speculative_tokens":1}' in mtp
    weights = {c.name: c.checkpoint.active_weight_gb for c in grid.configs.values()}
    assert weights == {"A_nvfp4_dfl5": 1.5, "A_nvfp4_dfl15": 1.5, "B_fp8_mtp1": 3.0}
    assert grid.study.hardware.memory_bandwidth_gb_s == 273


def test_a_study_without_depths_or_natural_measures_nothing():
    config = copy.deepcopy(load_yaml(REPO / "config/mechanism.yaml"))
    del config["depths"], config["natural"]
    with pytest.raises(ConfigError, match="measures nothing"):
        load_grid(config, "mechanism.yaml")
    config["natural"] = {}
    grid = load_grid(config, "mechanism.yaml")
    plan = depth_plan(grid)
    assert plan.cells == plan.skipped == plan.cached_cells == ()
    assert len(natural_plan(grid).cells) == 4 * 4 * 4  # the defaults
