"""One generated llama in both engines' formats: the vLLM checkpoint (safetensors BF16) and
the GGUF converted from it hold the same weights."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from gridbench.assets.gguf_model import ModelShape, write_random_llama_gguf
from gridbench.assets.llama_formats import (
    gguf_from_hf,
    hf_active_weight_bytes,
    hf_name,
    to_gguf_rotary,
    to_hf_rotary,
    write_hf_llama,
)
from gridbench.assets.safetensors_stream import from_bfloat16, read_safetensors, to_bfloat16
from gridbench.errors import GridbenchError

SHAPE = ModelShape(n_embd=128, n_layer=2, n_ff=256, head_dim=32, n_ctx=8192, n_head_kv=2)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_hf_llama(tmp_path_factory.mktemp("hf") / "rand", SHAPE, layer_seed=1, threads=2)


def _gguf_tensors(path):
    return {t.name: np.array(t.data) for t in gguf.GGUFReader(str(path)).tensors}


def test_checkpoint_has_every_llama_tensor_in_bf16(checkpoint):
    stored = {t.name: t for t in read_safetensors(checkpoint / "model.safetensors")}
    config = json.loads((checkpoint / "config.json").read_text())
    h, kv = config["hidden_size"], config["num_key_value_heads"] * config["head_dim"]
    expected = {"model.embed_tokens.weight": (config["vocab_size"], h), "model.norm.weight": (h,)}
    expected["lm_head.weight"] = (config["vocab_size"], h)
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        expected |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (config["num_attention_heads"] * config["head_dim"], h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, h),
            p + "mlp.gate_proj.weight": (config["intermediate_size"], h),
            p + "mlp.up_proj.weight": (config["intermediate_size"], h),
            p + "mlp.down_proj.weight": (h, config["intermediate_size"]),
        }
    assert {name: t.shape for name, t in stored.items()} == expected
    assert {t.dtype for t in stored.values()} == {"BF16"}
    assert config["torch_dtype"] == "bfloat16" and config["max_position_embeddings"] == SHAPE.n_ctx
    assert all(np.isfinite(t.float32()).all() for t in stored.values())


def test_the_gguf_converted_from_the_checkpoint_is_the_generated_model(checkpoint, tmp_path):
    """Converted back, every tensor is the generator's own (F32 GGUF) up to BF16 rounding:
    the names map, and the rotary permutation undoes the one the checkpoint was written with."""
    converted = _gguf_tensors(gguf_from_hf(checkpoint, tmp_path / "converted.gguf", "f32", threads=2))
    direct = _gguf_tensors(write_random_llama_gguf(tmp_path / "direct.gguf", SHAPE, "f32", layer_seed=1))
    assert converted.keys() == direct.keys()
    for name, values in direct.items():
        assert np.array_equal(converted[name], from_bfloat16(to_bfloat16(values))), name
    metadata = gguf.GGUFReader(str(tmp_path / "converted.gguf")).fields
    assert int(metadata["llama.context_length"].parts[-1][0]) == SHAPE.n_ctx
    assert float(metadata["llama.rope.freq_base"].parts[-1][0]) == 10000.0


def test_f16_conversion_keeps_the_norms_in_f32(checkpoint, tmp_path):
    reader = gguf.GGUFReader(str(gguf_from_hf(checkpoint, tmp_path / "f16.gguf", "f16", threads=2)))
    kinds = {t.name: t.tensor_type for t in reader.tensors}
    assert kinds["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.F16
    assert kinds["blk.0.attn_norm.weight"] == gguf.GGMLQuantizationType.F32


def _rope_hf(x: np.ndarray, position: int, theta: float = 10000.0) -> np.ndarray:
    """transformers' rotate_half rope on one head: dimension i pairs with i + d/2."""
    d = x.shape[0]
    freqs = position * theta ** (-np.arange(0, d, 2) / d)
    cos, sin = np.tile(np.cos(freqs), 2), np.tile(np.sin(freqs), 2)
    rotated = np.concatenate([-x[d // 2 :], x[: d // 2]])
    return x * cos + rotated * sin


def _rope_gguf(x: np.ndarray, position: int, theta: float = 10000.0) -> np.ndarray:
    """llama.cpp's normal rope on one head: dimension 2i pairs with 2i + 1."""
    d = x.shape[0]
    freqs = position * theta ** (-np.arange(0, d, 2) / d)
    even, odd = x[0::2], x[1::2]
    out = np.empty_like(x)
    out[0::2] = even * np.cos(freqs) - odd * np.sin(freqs)
    out[1::2] = even * np.sin(freqs) + odd * np.cos(freqs)
    return out


def test_the_rotary_permutation_makes_both_engines_rotate_the_same_pairs():
    """q·k after rope is what attention sees: with the GGUF rows permuted, llama.cpp's
    interleaved rope gives the same scores as transformers' half-split rope."""
    heads, head_dim, hidden = 2, 8, 16
    rng = np.random.default_rng(3)
    w_q, w_k = rng.standard_normal((2, heads * head_dim, hidden))
    x_q, x_k = rng.standard_normal((2, hidden))
    q_hf, k_hf = (w_q @ x_q).reshape(heads, head_dim), (w_k @ x_k).reshape(heads, head_dim)
    g_q = (to_gguf_rotary(w_q, heads) @ x_q).reshape(heads, head_dim)
    g_k = (to_gguf_rotary(w_k, heads) @ x_k).reshape(heads, head_dim)
    for h in range(heads):
        hf_score = _rope_hf(q_hf[h], 7) @ _rope_hf(k_hf[h], 3)
        gguf_score = _rope_gguf(g_q[h], 7) @ _rope_gguf(g_k[h], 3)
        assert gguf_score == pytest.approx(hf_score, rel=1e-9)
    assert np.array_equal(to_hf_rotary(to_gguf_rotary(w_q, heads), heads), w_q)


def test_tensor_names_map_like_convert_hf_to_gguf():
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("blk.12.ffn_down.weight") == "model.layers.12.mlp.down_proj.weight"
    assert hf_name("output.weight") == "lm_head.weight"


def test_active_weight_bytes_count_fp8_projections_at_one_byte(checkpoint):
    bf16 = hf_active_weight_bytes(checkpoint / "model.safetensors")
    fp8 = hf_active_weight_bytes(checkpoint / "model.safetensors", linear_bytes_per_weight=1)
    projections = SHAPE.parameters
    assert bf16 - fp8 == projections  # two bytes each become one
    vocab = json.loads((checkpoint / "config.json").read_text())["vocab_size"]
    assert bf16 == 2 * (projections + vocab * SHAPE.n_embd + (2 * SHAPE.n_layer + 1) * SHAPE.n_embd)


def test_converting_a_folder_that_is_no_checkpoint_says_what_to_do(tmp_path):
    with pytest.raises(GridbenchError, match="not a generated checkpoint") as failure:
        gguf_from_hf(tmp_path, tmp_path / "x.gguf")
    assert "gridbench assets hf-llama" in str(failure.value)
