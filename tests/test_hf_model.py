"""The CPU vLLM grid's generated HF-format models: loadable, the drafts as claimed."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from safetensors.numpy import load_file

from conftest import REPO
from gridbench.assets.hf_model import MODEL_FILES, VLLM_TEST_MODELS, write_vllm_test_models


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-models")
    write_vllm_test_models(root)
    return root


def test_every_model_folder_is_complete(models):
    for name in VLLM_TEST_MODELS:
        assert sorted(p.name for p in (models / name).iterdir()) == sorted(MODEL_FILES)


def test_the_workflow_rule_names_the_files_the_generator_writes():
    rules = (REPO / "workflow/rules/assets.smk").read_text()
    rule = rules[rules.index("rule make_vllm_models:") :]
    assert re.findall(r'"([\w-]+)"', rule[: rule.index("file=")]) == list(VLLM_TEST_MODELS)
    assert re.findall(r'"([\w.-]+\.\w+)"', rule[rule.index("file=") : rule.index("log:")]) == list(
        MODEL_FILES
    )


def test_self_draft_is_the_target_and_random_draft_is_not(models):
    target = (models / "target/model.safetensors").read_bytes()
    assert (models / "draft-self/model.safetensors").read_bytes() == target
    assert (models / "draft-random/model.safetensors").read_bytes() != target
    random_lm_head = load_file(models / "draft-random/model.safetensors")["lm_head.weight"]
    target_lm_head = load_file(models / "target/model.safetensors")["lm_head.weight"]
    assert random_lm_head.shape[0] == target_lm_head.shape[0]  # same vocab: vLLM requires it
    assert abs(np.corrcoef(random_lm_head[:, 1:2].ravel(), target_lm_head[:, 1:2].ravel())[0, 1]) < 0.1


def test_generation_is_deterministic(models, tmp_path):
    write_vllm_test_models(tmp_path)
    for name in VLLM_TEST_MODELS:
        for file in MODEL_FILES:
            assert (tmp_path / name / file).read_bytes() == (models / name / file).read_bytes(), file


def test_tensors_match_the_config(models):
    for name in VLLM_TEST_MODELS:
        config = json.loads((models / name / "config.json").read_text())
        tensors = load_file(models / name / "model.safetensors")
        h, v = config["hidden_size"], config["vocab_size"]
        assert tensors["model.embed_tokens.weight"].shape == (v, h)
        assert tensors["lm_head.weight"].shape == (v, h)
        q = config["num_attention_heads"] * config["head_dim"]
        kv = config["num_key_value_heads"] * config["head_dim"]
        for layer in range(config["num_hidden_layers"]):
            prefix = f"model.layers.{layer}."
            assert tensors[prefix + "self_attn.q_proj.weight"].shape == (q, h)
            assert tensors[prefix + "self_attn.k_proj.weight"].shape == (kv, h)
            assert tensors[prefix + "self_attn.o_proj.weight"].shape == (h, q)
            assert tensors[prefix + "mlp.down_proj.weight"].shape == (h, config["intermediate_size"])
            # nothing writes the constant channel 0 of the residual stream
            assert not tensors[prefix + "self_attn.o_proj.weight"][0].any()
            assert not tensors[prefix + "mlp.down_proj.weight"][0].any()
        assert len(tensors) == 2 + 1 + 9 * config["num_hidden_layers"]
        assert (tensors["model.embed_tokens.weight"][:, 0] == 1.0).all()


def test_tokenizer_and_chat_template_load_with_transformers(models):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(models / "target")
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token == "<|im_end|>"
    assert json.loads((models / "target/config.json").read_text())["eos_token_id"] == eos
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "the old house"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nthe old house<|im_end|>\n<|im_start|>assistant\n"
    # only printable pieces can be generated: control and byte tokens are weighed out
    lm_head = load_file(models / "target/model.safetensors")["lm_head.weight"]
    forbidden = lm_head[:, 0] < 0
    assert forbidden[eos] and forbidden[tokenizer.convert_tokens_to_ids("<0x0A>")]
    assert not forbidden[tokenizer.convert_tokens_to_ids("▁the")]
    assert all(tokenizer.decode([i]).isprintable() for i in np.flatnonzero(~forbidden))
