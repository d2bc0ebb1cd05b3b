"""The random-weight Qwen3 target and DFlash draft head: files, configs and tensors in the
layout vLLM 0.26.0 loads (checked against its sources, which this venv does not install)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gridbench.assets.dflash_model import (
    DRAFT_LAYERS_TINY,
    QWEN3_3B,
    QWEN3_TINY,
    qwen3_config,
    target_layer_ids,
    vocab_layout,
    write_dflash_draft,
    write_qwen3_dflash,
    write_qwen3_target,
)
from gridbench.assets.gguf_model import vocab
from gridbench.assets.hf_model import MODEL_FILES
from gridbench.assets.safetensors_stream import read_safetensors
from gridbench.cli import main
from gridbench.util import codec


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3-dflash")
    assert main(["assets", "qwen3-dflash", "--outdir", str(root), "--tiny"]) == 0
    return root


def _tensors(path) -> dict[str, np.ndarray]:
    return {t.name: t for t in read_safetensors(path / "model.safetensors")}


def _config(path) -> dict:
    return json.loads((path / "config.json").read_text())


def qwen3_layer(p: str, config: dict) -> dict[str, tuple[int, ...]]:
    """One Qwen3 decoder layer's tensors under the prefix ``p``."""
    h, ffn, hd = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    return {
        p + "input_layernorm.weight": (h,),
        p + "post_attention_layernorm.weight": (h,),
        p + "self_attn.q_proj.weight": (q, h),
        p + "self_attn.k_proj.weight": (kv, h),
        p + "self_attn.v_proj.weight": (kv, h),
        p + "self_attn.o_proj.weight": (h, q),
        p + "self_attn.q_norm.weight": (hd,),
        p + "self_attn.k_norm.weight": (hd,),
        p + "mlp.gate_proj.weight": (ffn, h),
        p + "mlp.up_proj.weight": (ffn, h),
        p + "mlp.down_proj.weight": (h, ffn),
    }


def expected_qwen3_tensors(config: dict) -> dict[str, tuple[int, ...]]:
    """Every parameter of HF ``Qwen3ForCausalLM`` (untied): Llama's plus per-head q/k norms."""
    h, vocab_size = config["hidden_size"], config["vocab_size"]
    names = {
        "model.embed_tokens.weight": (vocab_size, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (vocab_size, h),
    }
    for i in range(config["num_hidden_layers"]):
        names |= qwen3_layer(f"model.layers.{i}.", config)
    return names


def expected_dflash_tensors(draft: dict, target: dict) -> dict[str, tuple[int, ...]]:
    """What vLLM 0.26.0's DFlashQwen3ForCausalLM loads, from
    vllm/model_executor/models/qwen3_dflash.py:

    * ``load_weights`` prefixes every name without ``lm_head`` with ``model.``, so the
      checkpoint names are DFlashQwen3Model's own: no ``model.`` prefix here;
    * DFlashQwen3Model: ``layers.N`` (DFlashQwen3DecoderLayer: Qwen3 attention with
      ``q_norm``/``k_norm`` over ``head_dim``, Qwen2MLP, the two RMSNorms; its
      hf_to_vllm_mapper stacks q/k/v_proj into qkv_proj and gate/up_proj into gate_up_proj),
      ``fc`` (ReplicatedLinear, no bias, ``[hidden, target_hidden * len(target_layer_ids)]``
      since the config has no ``target_hidden_size``), ``hidden_norm`` (the context states'
      RMSNorm before the fused K/V projection) and the final ``norm``;
    * ``embed_tokens`` and ``lm_head`` are optional: absent, ``has_own_embed_tokens`` and
      ``has_own_lm_head`` stay False and the proposer shares the target's (which requires the
      draft's hidden size to be the target's); ``mask_embedding`` only comes from a
      ``mask_embedding.pt``; ``d2t``/``t2d`` only for a smaller draft vocabulary; a
      ``mask_hidden`` tensor is refused.
    """
    h = draft["hidden_size"]
    taps = len(draft["dflash_config"]["target_layer_ids"])
    names = {
        "fc.weight": (h, target["hidden_size"] * taps),
        "hidden_norm.weight": (h,),
        "norm.weight": (h,),
    }
    for i in range(draft["num_hidden_layers"]):
        names |= qwen3_layer(f"layers.{i}.", draft)
    return names


def test_the_cli_writes_a_complete_target_and_draft(pair):
    assert {p.name for p in (pair / "target").iterdir()} == set(MODEL_FILES)
    # vLLM takes a DFlash draft's tokenizer from the target
    assert {p.name for p in (pair / "dflash").iterdir()} == {"config.json", "model.safetensors"}


def test_the_target_holds_every_qwen3_parameter(pair):
    config = _config(pair / "target")
    tensors = _tensors(pair / "target")
    assert {name: t.shape for name, t in tensors.items()} == expected_qwen3_tensors(config)
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["model_type"] == "qwen3"
    assert config["tie_word_embeddings"] is False and config["torch_dtype"] == "bfloat16"


def test_the_draft_holds_exactly_what_vllm_dflash_loads(pair):
    draft, target = _config(pair / "dflash"), _config(pair / "target")
    tensors = _tensors(pair / "dflash")
    assert {name: t.shape for name, t in tensors.items()} == expected_dflash_tensors(draft, target)
    assert not any("embed_tokens" in n or "lm_head" in n or "mask_hidden" in n for n in tensors)


def test_the_draft_config_is_what_vllm_dflash_reads(pair):
    """The rules of vLLM 0.26.0 the pair must meet, by source:

    * config/speculative.py wraps the draft config in EAGLEConfig(method="dflash"), which
      keeps an architecture starting with "DFlash"; model_executor/models/registry.py maps
      "DFlashDraftModel" to qwen3_dflash.DFlashQwen3ForCausalLM;
    * v1/worker/gpu/spec_decode/eagle/eagle3_utils.py taps the target's aux hidden states
      at ``target_layer_ids[i] + 1`` (collected after layer ``id``), each once: the ids must be
      distinct target layers, or the concatenation is narrower than fc and the run fails;
    * v1/worker/gpu/spec_decode/utils.py reads ``dflash_config.mask_token_id``, which the
      shared embedding must hold;
    * qwen3_dflash.DFlashQwen3ForCausalLM: ``draft_vocab_size`` (default vocab_size) equal to
      the target's vocabulary means no d2t mapping;
    * qwen3_dflash._resolve_layer_attention: full-attention layers with no
      ``dflash_config.causal`` run non-causally (FLASH_ATTN on Hopper) and need no V2-only
      mixed sliding/full KV groups.
    """
    draft, target = _config(pair / "dflash"), _config(pair / "target")
    assert draft["architectures"] == ["DFlashDraftModel"] and draft["model_type"] == "qwen3"
    ids = draft["dflash_config"]["target_layer_ids"]
    assert len(set(ids)) == len(ids) == draft["num_hidden_layers"]
    assert all(0 <= i < target["num_hidden_layers"] for i in ids)
    assert draft["num_target_layers"] == target["num_hidden_layers"]
    mask = draft["dflash_config"]["mask_token_id"]
    assert len(vocab()[0]) <= mask < target["vocab_size"]  # in the embedding, past the tokenizer
    assert draft["vocab_size"] == target["vocab_size"] and "draft_vocab_size" not in draft
    for key in ("hidden_size", "head_dim", "rope_theta", "max_position_embeddings"):
        assert draft[key] == target[key], key
    assert draft["layer_types"] == ["full_attention"] * draft["num_hidden_layers"]
    assert "causal" not in draft["dflash_config"] and draft["use_sliding_window"] is False
    assert draft["block_size"] == 16


def test_transformers_parses_both_configs_as_qwen3(pair):
    transformers = pytest.importorskip("transformers")
    target = transformers.AutoConfig.from_pretrained(pair / "target")
    draft = transformers.AutoConfig.from_pretrained(pair / "dflash")
    assert type(target).__name__ == type(draft).__name__ == "Qwen3Config"
    assert target.head_dim == QWEN3_TINY.head_dim and target.num_key_value_heads == QWEN3_TINY.kv_heads
    assert draft.architectures == ["DFlashDraftModel"]
    assert draft.dflash_config == {"mask_token_id": vocab_layout()[1], "target_layer_ids": [1, 3]}
    assert draft.num_hidden_layers == DRAFT_LAYERS_TINY


def _stacked(tensors: dict[str, np.ndarray], name: str) -> np.ndarray | None:
    """The checkpoint values vLLM's parameter ``name`` should hold (q/k/v and gate/up stacked)."""
    for fused, parts in (
        ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
        ("gate_up_proj", ("gate_proj", "up_proj")),
    ):
        if name.endswith(f"{fused}.weight"):
            return np.concatenate([tensors[name.replace(fused, part)] for part in parts])
    return tensors.get(name)


def test_vllm_loads_the_pair_into_its_own_modules(pair, monkeypatch, tmp_path):
    """Where vLLM 0.26.0 and torch are installed (not in gridbench's venv): its own config
    logic reads both folders, and its own Qwen3ForCausalLM and DFlashQwen3ForCausalLM load
    them, every parameter getting its checkpoint value. Runs on CPU: the attention layer
    (weightless, GPU-only backends) is stubbed."""
    torch = pytest.importorskip("torch", reason="vLLM's model classes need torch, absent from this venv")
    pytest.importorskip("vllm", reason="vLLM 0.26.0 is not installed in this venv")
    from torch import nn
    from vllm import config as vc
    from vllm.distributed import parallel_state
    from vllm.model_executor.models import qwen2, qwen3, qwen3_dflash
    from vllm.model_executor.models.registry import ModelRegistry

    class Weightless(nn.Module):
        def __init__(self, *args, **kwargs):
            super().__init__()

    for module in (qwen2, qwen3, qwen3_dflash):
        monkeypatch.setattr(module, "Attention", Weightless)
    target = vc.ModelConfig(model=str(pair / "target"), dtype="bfloat16", max_model_len=1024)
    parallel = vc.ParallelConfig()
    spec = vc.SpeculativeConfig(
        method="dflash",
        model=str(pair / "dflash"),
        num_speculative_tokens=8,
        target_model_config=target,
        target_parallel_config=parallel,
    )
    assert (
        ModelRegistry.resolve_model_cls(spec.draft_model_config.architectures, spec.draft_model_config)[0]
        is qwen3_dflash.DFlashQwen3ForCausalLM
    )
    config = vc.VllmConfig(
        model_config=target,
        speculative_config=spec,
        parallel_config=parallel,
        device_config=vc.DeviceConfig("cpu"),
    )

    def weights(model: str):
        return (
            (t.name, torch.from_numpy(t.float32()).to(torch.bfloat16))
            for t in read_safetensors(pair / model / "model.safetensors")
        )

    with vc.set_current_vllm_config(config), torch.device("cpu"):
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.init_distributed_environment(1, 0, f"file://{tmp_path / 'pg'}", 0, "gloo")
            parallel_state.initialize_model_parallel(1, 1)
        torch.set_default_dtype(torch.bfloat16)
        try:
            target_model = qwen3.Qwen3ForCausalLM(vllm_config=config)
            target_model.load_weights(weights("target"))
            draft_model = qwen3_dflash.DFlashQwen3ForCausalLM(vllm_config=config)
            draft_model.load_weights(weights("dflash"))
        finally:
            torch.set_default_dtype(torch.float32)
    assert not draft_model.has_own_embed_tokens and not draft_model.has_own_lm_head  # the target's are shared
    for model, folder, prefix in ((target_model, "target", ""), (draft_model, "dflash", "model.")):
        tensors = {t.name: t.float32() for t in read_safetensors(pair / folder / "model.safetensors")}
        for name, param in model.named_parameters():
            shared = ("model.embed_tokens.weight", "lm_head.weight", "model.mask_embedding")
            if model is draft_model and name in shared:
                continue  # the first two the proposer takes from the target; no mask_embedding.pt here
            stored = _stacked(tensors, name.removeprefix(prefix))
            assert stored is not None, name
            np.testing.assert_array_equal(param.detach().float().numpy(), stored, err_msg=name)


def test_target_layer_ids_match_the_reference_spread():
    assert target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # z-lab/Qwen3-8B-DFlash-b16
    assert target_layer_ids(64, 5) == [1, 16, 31, 46, 61]  # z-lab/Qwen3.6-27B-DFlash
    assert target_layer_ids(QWEN3_3B.layers, 5) == [1, 7, 13, 19, 25]
    assert target_layer_ids(6, 1) == [3]
    with pytest.raises(ValueError, match="distinct target layers"):
        target_layer_ids(4, 2)


def test_weights_are_finite_bf16(pair):
    for model in ("target", "dflash"):
        for tensor in read_safetensors(pair / model / "model.safetensors"):
            assert tensor.dtype == "BF16", tensor.name
            assert np.isfinite(tensor.float32()).all(), tensor.name


def test_the_generator_is_deterministic_and_seeds_the_layers(tmp_path, pair):
    write_qwen3_target(tmp_path / "again", QWEN3_TINY)
    write_dflash_draft(tmp_path / "draft-again", QWEN3_TINY, DRAFT_LAYERS_TINY)
    for ours, again in (("target", "again"), ("dflash", "draft-again")):
        for name in ("model.safetensors", "config.json"):
            assert (pair / ours / name).read_bytes() == (tmp_path / again / name).read_bytes()
    other = _tensors(write_qwen3_target(tmp_path / "other", QWEN3_TINY, seed=7))
    ours = _tensors(pair / "target")
    assert not np.array_equal(
        other["model.layers.0.self_attn.q_proj.weight"].raw,
        ours["model.layers.0.self_attn.q_proj.weight"].raw,
    )
    # the embedding and output matrix are gguf_model's fixed ones, whatever the layer seed
    assert np.array_equal(other["lm_head.weight"].raw, ours["lm_head.weight"].raw)


def test_no_token_outside_the_generated_words_is_ever_predicted(pair):
    """The next token a token's embedding predicts (the layers only nudge it) is a whole
    word: never EOS, a control or byte token, nor a padding id such as the mask token."""
    tensors = _tensors(pair / "target")
    embedding, output = tensors["model.embed_tokens.weight"].float32(), tensors["lm_head.weight"].float32()
    normed = embedding / np.sqrt((embedding**2).mean(axis=1, keepdims=True) + 1e-6)
    predicted = (normed @ output.T).argmax(axis=1)
    _tokens, _scores, _types, first_word, _paris = vocab()
    assert predicted.min() >= first_word and predicted.max() < len(vocab()[0])
    # the ids past the tokenizer, which it could not decode, are pushed furthest down
    assert (output[len(vocab()[0]) :, 0] < 5 * output[0, 0]).all()


def test_the_3b_shape_is_about_3b_parameters():
    expected = expected_qwen3_tensors(codec.to_json(qwen3_config(QWEN3_3B)))
    parameters = sum(int(np.prod(shape)) for shape in expected.values())
    assert 2.7e9 < parameters < 3.2e9


def test_write_qwen3_dflash_returns_both_folders(tmp_path):
    assert write_qwen3_dflash(tmp_path, tiny=True) == [tmp_path / "target", tmp_path / "dflash"]
