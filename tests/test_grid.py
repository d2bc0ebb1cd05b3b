"""The grid: seed 002 expressed exactly, filters, fingerprints (its cells: test_plan.py)."""

from __future__ import annotations

import pytest

from conftest import REPO, load_yaml
from gridbench.aggregate.records import ConfigIdentity
from gridbench.config.grid import Grid
from gridbench.config.loading import load_grid, load_grid_files
from gridbench.errors import ConfigError

SEED_CONFIGS = [
    "Q_bf16_stock_n0",
    "Q_bf16_eugr_n0",
    "Q_bf16_aeon_n0",
    "Q_nvfp4_stock_n0",
    "Q_nvfp4_eugr_n0",
    "Q_nvfp4_aeon_n0",
    "Q_bf16_dfl1",
    "Q_bf16_dfl8",
    "Q_nvfp4_dfl8",
]
SEED_DEPTHS = [0, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152, 65536]


def seed_grid(**overrides) -> Grid:
    return load_grid_files([REPO / "config/config.yaml"], overrides)


def test_seed_002_grid_is_expressed_exactly():
    grid = seed_grid()
    assert list(grid.configs) == SEED_CONFIGS
    assert list(grid.depths) == SEED_DEPTHS
    images = {c.engine.image for c in grid.configs.values()}
    assert images == {
        "vllm/vllm-openai:latest",
        "eugr/spark-vllm:latest",
        "ghcr.io/aeon-7/aeon-vllm-ultimate:2026-06-18-v0.23.0-dflashfix",
    }
    b = grid.benchy
    assert (b.pp, b.tg, b.exact_tg, b.runs, b.latency_mode) == (512, 256, True, 2, "generation")
    for cfg in grid.configs.values():
        s = cfg.serving
        assert (
            s.max_model_len,
            s.gpu_memory_utilization,
            s.prefix_caching,
            s.chunked_prefill,
            s.tensor_parallel_size,
        ) == (131072, 0.80, False, True, 1)
    dflash = grid.configs["Q_nvfp4_dfl8"]
    assert dflash.engine.name == "aeon" and dflash.checkpoint.quantization == "NVFP4"
    assert dflash.speculation.num_speculative_tokens == 8
    assert dflash.speculation.extra == {"draft_sample_method": "probabilistic"}
    assert list(dflash.serve_args[:2]) == ["--attention-backend", "flash_attn"]
    assert "--mamba-cache-dtype" in dflash.serve_args
    patches = [v.container for v in dflash.all_volumes if v.host.endswith(".py")]
    assert [p.rsplit("/", 1)[1] for p in patches] == ["qwen3_dflash.py", "llm_base_proposer.py"]


def test_unknown_filter_value_names_the_allowed_ones():
    with pytest.raises(
        ConfigError, match=r"engine=aoen: unknown engine aoen; allowed values: stock, eugr, aeon"
    ):
        seed_grid(engine="aoen")


def test_a_config_of_the_prefix_cache_pass_gets_an_engine_that_caches():
    grid = load_grid(load_yaml(REPO / "config/mechanism.yaml"), "mechanism.yaml")
    assert grid.prefix_cache_pass == ("D_q8_0_n0",)
    cold = grid.configs["D_q8_0_n0"]
    cached = cold.with_prefix_cache()
    assert not cold.serving.prefix_caching and cached.serving.prefix_caching
    assert cached.fingerprint() != cold.fingerprint()  # the slot manager starts another engine
    assert cached.with_prefix_cache() == cached  # a config with the cache on keeps its engine


def test_fingerprint_changes_with_what_starts_the_engine_only():
    grid = seed_grid()
    a = grid.configs["Q_bf16_stock_n0"]
    relabelled = seed_grid(configs={"Q_bf16_stock_n0": {"label": "renamed"}}).configs["Q_bf16_stock_n0"]
    retuned = seed_grid(serving={"gpu_memory_utilization": 0.7}).configs["Q_bf16_stock_n0"]
    assert a.fingerprint() == relabelled.fingerprint()
    assert a.fingerprint() != retuned.fingerprint()


def test_checkpoint_weights_default_to_its_name_and_leave_the_fingerprint_alone():
    plain = load_grid(load_yaml(REPO / "config/mechanism.yaml"), "mechanism.yaml")
    config = load_yaml(REPO / "config/mechanism.yaml")
    for checkpoint in config["checkpoints"].values():
        checkpoint["weights"] = "demo"
    shared = load_grid(config, "mechanism.yaml")
    assert plain.configs["D_q8_0_n0"].checkpoint.weights == "q8_0"
    assert {c.checkpoint.weights for c in shared.configs.values()} == {"demo"}
    assert ConfigIdentity.from_config(shared.configs["D_q8_0_n0"]).weights == "demo"
    assert shared.configs["D_q8_0_n0"].fingerprint() == plain.configs["D_q8_0_n0"].fingerprint()


def test_fingerprints_are_those_of_the_engines_already_measured():
    """A fingerprint names a running engine and a measured one in provenance records: a
    change in how a config is serialized must not change it (values from before the codec)."""
    grid = load_grid_files([REPO / "config/mechanism.yaml"])
    assert {name: cfg.fingerprint() for name, cfg in grid.configs.items()} == {
        "D_f16_n0": "4224d74f6958f0a0",
        "D_f16_draft4": "d4a0d9f4fb7b6a80",
        "D_q8_0_n0": "0056b85ca3ed7c60",
        "D_q8_0_draft4": "d7696555fb5a7375",
    }


def test_the_h100_overlay_names_the_card_and_changes_no_cell():
    """config/studies/on-h100.yaml over the real-model study: another card in the report,
    the same configs with the same fingerprints (the same engines, the same cells)."""
    alone = load_grid_files([REPO / "config/studies/h200-real.yaml"])
    on_h100 = load_grid_files([REPO / "config/studies/h200-real.yaml", REPO / "config/studies/on-h100.yaml"])
    assert on_h100.study.hardware.name == "NVIDIA H100 80GB HBM3" and "H100" in on_h100.study.title
    assert on_h100.study.hardware.memory_bandwidth_gb_s == 3350
    assert {n: c.fingerprint() for n, c in on_h100.configs.items()} == {
        n: c.fingerprint() for n, c in alone.configs.items()
    }
