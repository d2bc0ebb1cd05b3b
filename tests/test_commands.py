"""Serve command lines: the seeds' own flags come out as they wrote them."""

from __future__ import annotations

import shlex

from conftest import REPO
from gridbench.engines.commands import launch_plan
from gridbench.engines.describe import docker_run_argv
from gridbench.grid import load_config_files
from test_grid import seed_grid


def test_seed_002_dflash_config_serve_flags():
    cfg = seed_grid().configs["Q_nvfp4_dfl8"]
    argv = list(launch_plan(cfg, 8000).argv)
    assert argv == [
        "serve",
        "/models/Qwen3.6-27B-AEON-Ultimate-Uncensored-NVFP4",
        "--served-model-name",
        "aeon27b",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        "--quantization",
        "compressed-tensors",
        "--max-model-len",
        "131072",
        "--gpu-memory-utilization",
        "0.80",
        "--tensor-parallel-size",
        "1",
        "--no-enable-prefix-caching",
        "--enable-chunked-prefill",
        "--speculative-config",
        '{"method":"dflash","model":"/draft","num_speculative_tokens":8,"draft_sample_method":"probabilistic"}',
        "--attention-backend",
        "flash_attn",
        "--mamba-cache-dtype",
        "float32",
    ]


def test_seed_002_container_mounts_the_draft_patches_into_the_aeon_image():
    cfg = seed_grid().configs["Q_bf16_dfl1"]
    line = shlex.join(docker_run_argv(cfg, 8000))
    assert "--network host --gpus all --ipc host --shm-size 16g" in line
    site = "/usr/local/lib/python3.12/site-packages/vllm"
    assert (
        f"-v /models/DSpark-Qwen3.6-27B-AEON-draft/vllm_patches/qwen3_dflash.py:"
        f"{site}/model_executor/models/qwen3_dflash.py:ro"
    ) in line
    assert (
        f"-v /models/DSpark-Qwen3.6-27B-AEON-draft/vllm_patches/llm_base_proposer.py:"
        f"{site}/v1/spec_decode/llm_base_proposer.py:ro"
    ) in line
    assert "--entrypoint vllm ghcr.io/aeon-7/aeon-vllm-ultimate:2026-06-18-v0.23.0-dflashfix serve " in line


def test_stock_image_entrypoint_takes_the_model_first():
    cfg = seed_grid().configs["Q_bf16_stock_n0"]
    assert launch_plan(cfg, 8000).argv[0] == "/models/Qwen3.6-27B-AEON-Ultimate-Uncensored"
    eugr = seed_grid().configs["Q_bf16_eugr_n0"]
    assert launch_plan(eugr, 8000).argv[:3] == (
        "vllm",
        "serve",
        "/models/Qwen3.6-27B-AEON-Ultimate-Uncensored",
    )


def test_llamacpp_draft_model_flags():
    grid = load_config_files([REPO / "config/demo.yaml"])
    argv = list(launch_plan(grid.configs["D_f16_draft4"], 9000).argv)
    assert argv[:3] == ["python3", "-m", "gridbench.testengines.xllamacpp_server"]
    assert argv[3:] == [
        "-m",
        "resources/models/demo/target-f16.gguf",
        "--alias",
        "demo-f16",
        "--host",
        "127.0.0.1",
        "--port",
        "9000",
        "-c",
        "2048",
        "-np",
        "1",
        "--metrics",
        "--no-cache-prompt",
        "--spec-type",
        "draft-simple",
        "-md",
        "resources/models/demo/draft-q8_0.gguf",
        "--spec-draft-n-max",
        "4",
        "--threads",
        "2",
    ]


def test_config_values_stay_literal_arguments():
    grid = load_config_files(
        [REPO / "config/demo.yaml"], {"configs": {"D_f16_n0": {"extra_args": ["x; touch pwned", "$(id)"]}}}
    )
    argv = launch_plan(grid.configs["D_f16_n0"], 9000).argv
    assert argv[-2:] == ("x; touch pwned", "$(id)")


def test_llamacpp_ngram_types_take_their_own_draft_length_flag():
    grid = load_config_files([REPO / "config/studies/h200-llamacpp.yaml"])
    argv = list(launch_plan(grid.configs["F16_ngram16"], 9000).argv)
    assert argv[argv.index("--spec-type") : argv.index("--spec-type") + 4] == [
        "--spec-type",
        "ngram-mod",
        "--spec-ngram-mod-n-max",
        "16",
    ]
    assert "--spec-draft-n-max" not in argv
    draft = list(launch_plan(grid.configs["Q4_0_draft8"], 9000).argv)
    assert draft[0] == "resources/llamacpp-cuda/bin/llama-server"
    assert draft[draft.index("-md") + 1 : draft.index("-md") + 4] == [
        "resources/models/h200/target-q4_0.gguf",
        "--spec-draft-n-max",
        "8",
    ]
